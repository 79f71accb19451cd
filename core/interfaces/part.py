"""What every registered component module declares, whatever its kind."""
from __future__ import annotations

from typing import ClassVar

from torch import nn


class Part(nn.Module):
    """What every registered component module declares, whatever its kind (the kind's base class
    subclasses this): the recipe parameters the conformance kit builds it with, whether it
    initialises its own weights, and which of its parameters weight decay leaves alone."""

    #: Recipe parameters for the conformance kit when none are given (a required one, a width that
    #: fits the kit's small shapes); {} when the defaults do.
    example_params: ClassVar[dict] = {}
    #: True when the constructor's initialisation must stand: the model's N(0, std) pass
    #: (``seqzoo.nn.init.init_weights``) leaves the module and everything in it alone.
    own_init: ClassVar[bool] = False
    #: Names of parameters the optimizer must not decay whatever their shape (Mamba's A_log and D,
    #: as its reference implementation keeps them); the trainer decays weight matrices otherwise.
    no_weight_decay: ClassVar[tuple[str, ...]] = ()
