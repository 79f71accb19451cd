"""The training recipe's parts: an optimizer (kind ``optimizer``, base ``UpdateRule``) and a
learning-rate schedule (kind ``schedule``, base ``Schedule``), chosen by name in ``train:``
(``optimizer: {kind: muon, momentum: 0.95}``, ``schedule: {kind: wsd, decay: 0.2}``).

The trainer sorts the parameters that train by what the model declares (``TrainedParameters``)
and hands them to the optimizer; the optimizer only groups them. The schedule is a pure function
of the step, so a resumed run continues on the same curve.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import Tensor


@dataclass(frozen=True)
class TrainedParameters:
    """The parameters that train, sorted by what the model declares (``seqzoo.train`` builds it;
    the order is the model's, so two runs of one recipe group alike).

    decayed: tensors of two or more dimensions — weight matrices, embedding tables, convolution
    kernels, stacked experts — which ``train.weight_decay`` applies to. undecayed: vectors (norm
    scales, biases) and what a part lists in ``no_weight_decay`` (Mamba's A_log and D: tensors
    shaped like matrices that are not weights). hidden: the decayed 2-D matrices inside the model's
    layers (``Model.shard_units``), embedding tables excepted — the hidden matrices Muon
    orthogonalises; the embeddings, the LM head, a pooler, convolution kernels (3-D), stacked
    experts (3-D) and whatever a part exempts from decay are not among them. stacked: the row
    counts of the matrices a hidden matrix stacks (a part's ``stacked_rows``: [q | k | v] in one
    weight), by ``id``. names: each parameter's name by ``id``, for messages.
    """

    decayed: tuple[Tensor, ...]
    undecayed: tuple[Tensor, ...]
    hidden: tuple[Tensor, ...] = ()
    names: dict[int, str] = field(default_factory=dict)
    stacked: dict[int, tuple[int, ...]] = field(default_factory=dict)

    def groups(self, weight_decay: float, *, leave_out: tuple[Tensor, ...] = ()) -> list[dict]:
        """The two weight-decay groups every optimizer starts from: the decayed tensors at
        ``weight_decay``, the undecayed at 0 (in that order); ``leave_out``: tensors another
        group already holds (Muon's hidden matrices)."""
        taken = {id(p) for p in leave_out}
        return [{"params": [p for p in self.decayed if id(p) not in taken], "weight_decay": weight_decay},
                {"params": [p for p in self.undecayed if id(p) not in taken], "weight_decay": 0.0}]


class UpdateRule:
    """An optimizer (kind ``optimizer``). Constructor ``(**params)``: the recipe's options
    (``train.optimizer: {kind: sgd, momentum: 0.9}``); ``build`` makes the torch optimizer of one run.

    Each param group's ``lr`` as built is that group's peak: the schedule multiplies every group's
    peak by the same factor at each step. The optimizer's ``state_dict`` is what a checkpoint keeps
    (tensors, and param-group settings as JSON: tuples come back as lists), and it must load into a
    fresh ``build`` of the same model so that a resumed run continues bit for bit. A step with every
    group's ``lr`` at 0 must leave the parameters as they were: torch's distributed checkpointing
    takes such a step to create the state before it loads it.
    """

    #: Whether it trains parameters that FSDP2 has sharded (``train.parallel: fsdp``; each rank holds
    #: a slice of every matrix). False for an update that needs whole matrices (Muon's
    #: orthogonalisation): the trainer then refuses FSDP2 before the first step.
    shards: ClassVar[bool] = True
    #: Recipe parameters for the conformance kit when none are given; {} when the defaults do.
    example_params: ClassVar[dict] = {}

    def build(self, params: TrainedParameters, *, lr: float, weight_decay: float,
              betas: tuple[float, float]) -> torch.optim.Optimizer:
        """The torch optimizer over ``params`` at peak rate ``lr`` (``train.lr``), with ``train.weight_decay``
        and ``train.beta1``, ``train.beta2`` (for the optimizers that keep moment estimates)."""
        raise NotImplementedError(f"{type(self).__name__} must implement build(params, lr=..., weight_decay=..., "
                                  f"betas=...)")


class Schedule:
    """A learning-rate schedule (kind ``schedule``). Constructor ``(**params)``; ``factor`` is the
    rate at a step as a fraction of each group's peak, a pure function of its arguments.

    The default ``factor`` is linear warm-up, then ``decay``'s shape from the peak to the floor::

        factor(s) = (s + 1) / warmup                              s < warmup
                  = floor + (1 − floor) · decay(p),  p = min((s − warmup) / max(steps − warmup, 1), 1)
    """

    #: Recipe parameters for the conformance kit when none are given; {} when the defaults do.
    example_params: ClassVar[dict] = {}

    def factor(self, step: int, steps: int, warmup: int, floor: float) -> float:
        """The rate at ``step`` (0-based) of a run of ``steps``, as a fraction of the peak;
        ``warmup``: ``train.warmup``; ``floor``: ``train.min_lr_ratio``."""
        if step < warmup:
            return (step + 1) / warmup
        span = max(steps - warmup, 1)
        progress = min((step - warmup) / span, 1.0)
        return floor + (1 - floor) * self.decay(progress)

    def decay(self, progress: float) -> float:
        """The shape after warm-up: 1 at ``progress`` 0, falling to 0 at 1 (the floor)."""
        raise NotImplementedError(f"{type(self).__name__} must implement decay(progress) or factor(...)")
