"""RMSNorm with a unit offset (Gemma; Gemma Team, 2024): y = x̂ · (1 + w), x̂ = x / √(mean(x²) + ε).

The weight w starts at zero, so the layer starts as a plain RMS scaling. x̂ and 1 + w are computed
in float32 and the product is cast back last: adding 1 to a bfloat16 w would keep only 8 bits of it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqzoo.functional import upcast
from seqzoo.interfaces import Norm
from seqzoo.registry import builtin
from seqzoo.schema import PositiveFloat


@builtin("RMSNorm scaled by (1 + w), w zero-initialised, in float32 (Gemma)", aliases=("rmsnorm_unit_offset",))
class GemmaRMSNorm(Norm):
    """eps: inside the root (1e-6, Gemma's rms_norm_eps)."""

    own_init = True  # w = 0 (the identity scale), not the model's N(0, std)

    def __init__(self, dim: int, eps: PositiveFloat = 1e-6) -> None:
        super().__init__(dim)
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: Tensor) -> Tensor:
        """x (..., C) -> (..., C)."""
        normed = F.rms_norm(upcast(x), (self.dim,), eps=self.eps)
        return (normed * (1.0 + upcast(self.weight))).to(x.dtype)
