"""RMS normalisation (Zhang & Sennrich, 2019): y = x / √(mean(x²) + ε) · g.

No mean subtraction and no bias (T5's "LayerNorm" is this). Normalised in (at least) float32, cast back to
the input dtype, then multiplied by the weight (HF LLaMA order).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqzoo.functional import upcast
from seqzoo.interfaces import Norm
from seqzoo.registry import builtin
from seqzoo.schema import PositiveFloat


@builtin("RMSNorm: root-mean-square scaling, weight only (LLaMA, T5)", aliases=("rms",))
class RMSNorm(Norm):
    """eps: inside the root (1e-6; LLaMA-2 and Mistral use 1e-5)."""

    def __init__(self, dim: int, eps: PositiveFloat = 1e-6) -> None:
        super().__init__(dim)
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        """x (..., C) -> (..., C)."""
        if x.dtype in (torch.float32, torch.float64) and x.dtype == self.weight.dtype:
            return F.rms_norm(x, (self.dim,), self.weight, self.eps)  # one fused kernel
        normed = F.rms_norm(upcast(x), (self.dim,), eps=self.eps).to(x.dtype)
        return normed * self.weight
