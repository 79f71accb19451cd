"""Luong "general" (bilinear) attention (Luong, Pham & Manning, 2015).

    score(q, k) = scale · qᵀ W_h k        W_h ∈ R^{query_dim × key_dim}, one learnable matrix per head

q and k may have different sizes (a recurrent decoder reading a bidirectional encoder). ``attend``
folds W into the queries, q' = q W (one batched matmul over heads), and runs the fused
``scaled_dot_product_attention`` kernel on (q', k); ``scores`` is the explicit qᵀ W k.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from seqzoo.plugins.score.scaled_dot import ScaledDot
from seqzoo.registry import builtin
from seqzoo.schema import PositiveFloat


@builtin("Luong general qᵀWk, learnable W per head, folded into q for SDPA")
class Bilinear(ScaledDot):
    """scale · qᵀ W k with a learnable W of shape (H, query_dim, key_dim).

    scale: the logit scale; 1.0 (default) is Luong's, null means 1/√key_dim.

    W starts as the (rectangular) identity, so the score starts as Luong's dot product on the
    first min(query_dim, key_dim) features. It is initialised here, not by the model
    (``own_init``).
    """

    own_init = True

    def __init__(self, query_dim: int, key_dim: int, heads: int,
                 scale: PositiveFloat | None = 1.0) -> None:
        # The fused kernel sees (q W, k), both of size key_dim; null scale is then 1/√key_dim.
        super().__init__(key_dim, key_dim, heads, scale=scale)
        self.query_dim = query_dim
        self.weight = nn.Parameter(torch.eye(query_dim, key_dim).expand(heads, -1, -1).clone())

    def fold(self, q: Tensor) -> Tensor:
        """q (B, H, T, Dq) -> q W (B, H, T, Dk), every head in one batched matmul."""
        return q @ self.weight.to(q.dtype)

    def scores(self, q: Tensor, k: Tensor) -> Tensor:
        """q (B, H, T, Dq), k (B, H, S, Dk) -> scale · qᵀ W k (B, H, T, S)."""
        return torch.einsum("bhtd,hde,bhse->bhts", q, self.weight.to(q.dtype), k) * self.scale

    def attend(self, q: Tensor, k: Tensor, v: Tensor, *, mask: Tensor | None = None,
               bias: Tensor | None = None, causal: bool = False, dropout: float = 0.0) -> Tensor:
        """q (B, H, T, Dq), k (B, K, S, Dk), v (B, K, S, Dv) -> (B, H, T, Dv), fused.

        mask boolean (B|1, H|1, T, S), True = may attend; bias additive (B|1, H|1, T, S).
        """
        return super().attend(self.fold(q), k, v, mask=mask, bias=bias, causal=causal, dropout=dropout)
