"""QuickGELU (Radford et al., 2021, CLIP): quick_gelu(x) = x·σ(1.702x), a sigmoid fit of x·Φ(x).

Not the same function as GELU (errors up to ~0.02): CLIP checkpoints need this one.
"""
from __future__ import annotations

import torch
from torch import Tensor

from seqzoo.interfaces import Activation
from seqzoo.registry import builtin


@builtin("x·σ(1.702x), CLIP's fast GELU stand-in")
class QuickGelu(Activation):
    """No recipe params."""

    def forward(self, x: Tensor) -> Tensor:
        """x (...) -> (...)."""
        return x * torch.sigmoid(1.702 * x)
