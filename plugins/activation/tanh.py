"""Hyperbolic tangent: tanh(x) = (eˣ − e^(−x)) / (eˣ + e^(−x)), elementwise, range (−1, 1)."""
from __future__ import annotations

import torch
from torch import Tensor

from seqzoo.interfaces import Activation
from seqzoo.registry import builtin


@builtin("tanh(x), range (-1, 1)")
class Tanh(Activation):
    """No recipe params."""

    def forward(self, x: Tensor) -> Tensor:
        """x (...) -> (...)."""
        return torch.tanh(x)
