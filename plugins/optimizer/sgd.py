"""Stochastic gradient descent with momentum (Polyak, 1964; Sutskever et al., 2013 for Nesterov's
form), ``torch.optim.SGD``:

    g ← g + λ·θ,   b ← μ·b + g,   θ ← θ − lr · b          (Nesterov: θ ← θ − lr · (g + μ·b))

λ (``train.weight_decay``) is the L2 term added to the gradient, as torch's SGD applies it (coupled,
not AdamW's decoupled decay), and applies to weight matrices only.
"""
from __future__ import annotations

import torch

from seqzoo.errors import ConfigError
from seqzoo.interfaces import TrainedParameters, UpdateRule
from seqzoo.registry import builtin
from seqzoo.schema import NonNegativeFloat, UnitInterval


@builtin("SGD with momentum, optionally Nesterov's (torch.optim.SGD)")
class SGD(UpdateRule):
    """momentum: μ (0.9; 0 is plain SGD, which keeps no state). nesterov: Nesterov's momentum
    (false). dampening: the gradient's weight 1 − dampening in the momentum sum (0)."""

    def __init__(self, momentum: NonNegativeFloat = 0.9, nesterov: bool = False,
                 dampening: UnitInterval = 0.0) -> None:
        if nesterov and (momentum == 0 or dampening != 0):
            raise ConfigError(f"optimizer sgd: nesterov=true needs momentum > 0 and dampening 0, got momentum="
                              f"{momentum} and dampening={dampening}; set nesterov: false or change them")
        self.momentum, self.nesterov, self.dampening = momentum, nesterov, dampening

    def build(self, params: TrainedParameters, *, lr: float, weight_decay: float,
              betas: tuple[float, float]) -> torch.optim.Optimizer:
        return torch.optim.SGD(params.groups(weight_decay), lr=lr, momentum=self.momentum,
                               nesterov=self.nesterov, dampening=self.dampening)
