"""Logistic sigmoid: σ(x) = 1 / (1 + e^(−x)), elementwise. The gate of the original GLU
(Dauphin et al., 2017; Shazeer, 2020's FFN_GLU)."""
from __future__ import annotations

import torch
from torch import Tensor

from seqzoo.interfaces import Activation
from seqzoo.registry import builtin


@builtin("1 / (1 + e^(-x)) (the original GLU gate)")
class Sigmoid(Activation):
    """No recipe params."""

    def forward(self, x: Tensor) -> Tensor:
        """x (...) -> (...)."""
        return torch.sigmoid(x)
