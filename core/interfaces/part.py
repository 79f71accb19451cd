"""What every registered component module declares, whatever its kind."""
from __future__ import annotations

from typing import ClassVar

from torch import nn


class Part(nn.Module):
    """What every registered component module declares, whatever its kind (the kind's base class
    subclasses this): the recipe parameters the conformance kit builds it with, and how the
    model's initialisation and the optimizer treat its tensors — per tensor, as mamba_ssm marks
    single tensors ``_no_reinit`` and ``_no_weight_decay``, so one protected bias does not exempt
    a whole module from the model's depth-scaled initialisation.

    Names are relative to the part (``"dt_proj.bias"``, ``"out_proj"``). A part may widen a
    declaration for one instance by assigning the attribute in its constructor (a mimetic start
    keeps the projection it copied)."""

    #: Recipe parameters for the conformance kit when none are given (a required one, a width that
    #: fits the kit's small shapes); {} when the defaults do.
    example_params: ClassVar[dict] = {}
    #: True when the constructor's initialisation of every tensor in the part must stand (a
    #: recurrent cell's U(−1/√H, 1/√H)): the model's pass (``seqzoo.nn.init.init_weights``) leaves
    #: the part and everything in it alone. Prefer ``keep_init`` for single tensors.
    own_init: ClassVar[bool] = False
    #: Parameters (``"dt_proj.bias"``) whose constructor initialisation the model's N(0, std) pass
    #: must leave alone (Mamba's Δ bias, its inverse-softplus start). The pass touches the weights
    #: and biases of ``nn.Linear`` and ``nn.Embedding`` modules only; other parameters (A_log, D,
    #: norms' scales, convolutions) always keep what the constructor gave them.
    keep_init: ClassVar[tuple[str, ...]] = ()
    #: The ``nn.Linear`` submodules whose output is added into the residual stream (attention's
    #: and Mamba's ``out_proj``, an FFN's ``down``): their weights start at std / √(branches), the
    #: residual branches of the whole model (GPT-2, mamba_ssm), so the stream's variance does not
    #: grow with depth.
    residual_projections: ClassVar[tuple[str, ...]] = ()
    #: Names of parameters the optimizer must not decay whatever their shape (Mamba's A_log and D,
    #: as its reference implementation keeps them); the trainer decays weight matrices otherwise.
    #: They are the part's own, not weights: an optimizer that treats hidden matrices apart (Muon)
    #: leaves them, whatever their shape, to AdamW (``seqzoo.interfaces.TrainedParameters``).
    no_weight_decay: ClassVar[tuple[str, ...]] = ()
    #: Weights that stack the rows of several matrices for one product where the math has several
    #: (``{"qkv_proj.weight": (H·D, K·D, K·D)}``: [q | k | v]), with each matrix's row count in
    #: order. An optimizer that treats a matrix as a whole (Muon orthogonalises it) treats each
    #: block as its own matrix, as it would the separate projections of transformers or
    #: torchtitan. Sizes depend on the instance: a part assigns it in its constructor.
    stacked_rows: ClassVar[dict[str, tuple[int, ...]]] = {}
