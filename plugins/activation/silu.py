"""SiLU / Swish-1 (Elfwing et al., 2017; Ramachandran et al., 2017): silu(x) = x·σ(x).

The gate of SwiGLU (Shazeer, 2020; LLaMA, Mistral).
"""
from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from seqzoo.interfaces import Activation
from seqzoo.registry import builtin


@builtin("x·σ(x), Swish-1 (SwiGLU in LLaMA, Mistral)", aliases=("swish",))
class Silu(Activation):
    """No recipe params."""

    def forward(self, x: Tensor) -> Tensor:
        """x (...) -> (...)."""
        return F.silu(x)
