"""Scaled dot-product attention (Vaswani et al., 2017): out = softmax(q·kᵀ / √D + bias, masked) · v.

``attend`` runs ``torch.nn.functional.scaled_dot_product_attention`` — the fused flash /
memory-efficient kernels on CUDA, the fused CPU kernel elsewhere — with grouped KV heads handled by
the kernel (``enable_gqa``) instead of copying them.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from seqzoo.errors import ConfigError
from seqzoo.functional import causal_mask, default_scale, masked_softmax_attend
from seqzoo.interfaces import FlexScore, ScoreFunction
from seqzoo.registry import builtin
from seqzoo.schema import PositiveFloat


@builtin("q·k/√D, fused scaled_dot_product_attention kernel (Vaswani 2017)", aliases=("sdpa",))
class ScaledDot(ScoreFunction):
    """q·k / √D.

    scale: the logit scale; null (default) means 1/√D. T5-style models use 1.0 (or the ``dot`` score).
    """

    def __init__(self, query_dim: int, key_dim: int, heads: int, scale: PositiveFloat | None = None) -> None:
        super().__init__(query_dim, key_dim, heads)
        if query_dim != key_dim:
            raise ConfigError(f"score scaled_dot: query_dim={query_dim} must equal key_dim={key_dim}; "
                              f"use score 'bilinear' for different query and key sizes")
        self.scale = default_scale(query_dim, scale)

    def scores(self, q: Tensor, k: Tensor) -> Tensor:
        """q (B, H, T, D), k (B, H, S, D) -> (B, H, T, S)."""
        return (q @ k.transpose(-2, -1)) * self.scale

    def flex(self) -> FlexScore:
        """q·k·scale, nothing more: FlexAttention's own product."""
        return FlexScore(self.scale)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, *, mask: Tensor | None = None,
               bias: Tensor | None = None, causal: bool = False, dropout: float = 0.0) -> Tensor:
        """q (B, H, T, D), k/v (B, K, S, D) -> (B, H, T, D) through the fused kernel."""
        if q.shape[-2] == 1 and torch.compiler.is_compiling():
            # One query per row in a compiled decode step: two small grouped matmuls and a softmax
            # the compiler fuses with the masking cost less than a flash-attention call (measured
            # ~10% of a GPT-2-shape step at batch 8, docs/performance.md).
            b, h, _, d = q.shape
            kv = k.shape[1]
            logits = (q.view(b, kv, h // kv, d) @ k.transpose(-2, -1)).view(b, h, 1, k.shape[-2])
            return masked_softmax_attend(logits * self.scale, v, mask=mask, bias=bias, causal=causal,
                                         dropout=dropout, training=self.training)
        if causal and mask is None and bias is not None:
            # SDPA cannot combine is_causal with an explicit bias; spell the mask out.
            mask = causal_mask(q.shape[-2], k.shape[-2], q.device)
        attn_mask = mask
        if bias is not None:
            attn_mask = bias.to(q.dtype)
            if mask is not None:
                attn_mask = attn_mask.masked_fill(~mask, float("-inf"))
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=dropout if self.training else 0.0,
            is_causal=causal and attn_mask is None, scale=self.scale, enable_gqa=k.shape[1] != q.shape[1],
        )
        if mask is not None:
            # Rows that see no key are zeros on every backend (some kernels return NaN there).
            out = out.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
        return out
