"""Sigmoid attention (Ramapuram et al., 2024, "Theory, Analysis, and Best Practices for Sigmoid
Self-Attention").

    out_i = Σ_j σ(q_i·k_j · s + b + bias_ij) v_j        (s = 1/√D by default, b = −ln n)

Each weight is an independent gate in (0, 1); nothing normalises a row, so a query may attend to
many keys at once or to none. The offset b = −ln n (n the training context length) keeps the sum of
weights near 1 at initialisation, which the paper finds necessary for stable training. Masked keys
get weight 0 and a query that sees no key gives zeros.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from seqzoo.errors import ConfigError
from seqzoo.functional import causal_mask, expand_kv, upcast
from seqzoo.interfaces import ScoreFunction
from seqzoo.schema import PositiveFloat, PositiveInt


class SigmoidAttention(ScoreFunction):
    """σ(scale·q·k + b) @ v, without softmax.

    context: n in the offset b = −ln n, the sequence length the model is trained at (1024).
    scale: the logit scale; null (default) means 1/√D.
    """

    # This score does not normalise with softmax: ``scores`` are the logits fed to σ, and ``attend``
    # is not softmax(scores) @ v. The conformance kit's softmax-equivalence check does not apply.
    normalization = "sigmoid"

    def __init__(self, query_dim: int, key_dim: int, heads: int, context: PositiveInt = 1024,
                 scale: PositiveFloat | None = None) -> None:
        super().__init__(query_dim, key_dim, heads)
        if query_dim != key_dim:
            raise ConfigError(f"score sigmoid: query_dim={query_dim} must equal key_dim={key_dim} "
                              f"(a dot product needs equal sizes)")
        self.scale = scale if scale is not None else 1.0 / math.sqrt(query_dim)
        self.offset = -math.log(context)

    def scores(self, q: Tensor, k: Tensor) -> Tensor:
        """The logits fed to σ: q (B, H, T, D), k (B, H, S, D) -> (B, H, T, S)."""
        return (q @ k.transpose(-2, -1)) * self.scale + self.offset

    def attend(self, q: Tensor, k: Tensor, v: Tensor, *, mask: Tensor | None = None,
               bias: Tensor | None = None, causal: bool = False, dropout: float = 0.0) -> Tensor:
        """q (B, H, T, D), k (B, K, S, D), v (B, K, S, Dv) -> (B, H, T, Dv); see ScoreFunction.attend."""
        heads = q.shape[1]
        logits = upcast(self.scores(q, expand_kv(k, heads)))  # (B, H, T, S), at least float32
        if bias is not None:
            logits = logits + bias
        weights = torch.sigmoid(logits)
        if mask is None and causal:
            mask = causal_mask(logits.shape[-2], logits.shape[-1], logits.device)
        if mask is not None:
            weights = weights.masked_fill(~mask, 0.0)  # no row to renormalise: zero is enough
        weights = weights.to(v.dtype)
        if dropout > 0.0 and self.training:
            weights = F.dropout(weights, p=dropout)
        return weights @ expand_kv(v, heads)
