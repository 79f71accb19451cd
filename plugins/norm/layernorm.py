"""Layer normalisation (Ba et al., 2016): y = (x − μ) / √(σ² + ε) · γ + β over the last dim
(biased variance, ε inside the root)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqzoo.interfaces import Norm
from seqzoo.registry import builtin
from seqzoo.schema import PositiveFloat


@builtin("LayerNorm: mean/variance normalisation with gain and bias", aliases=("ln",))
class LayerNorm(Norm):
    """eps: added to the variance (1e-5; BERT 1e-12). bias: learn β (true)."""

    def __init__(self, dim: int, eps: PositiveFloat = 1e-5, bias: bool = True) -> None:
        super().__init__(dim)
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        """x (..., C) -> (..., C)."""
        return F.layer_norm(x, (self.dim,), self.weight, self.bias, self.eps)
