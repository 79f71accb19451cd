"""Residual Transformer blocks: self-attention, optional cross-attention, feed-forward.

``placement: pre`` (GPT-2, LLaMA, T5): x <- x + F(norm(x)), with a final norm after the stack.
``placement: post`` (Vaswani 2017, BERT): x <- norm(x + F(x)).
"""
from __future__ import annotations

from typing import Literal

from torch import Tensor, nn

from .attention import AttentionConfig, AttentionInputs, MultiHeadAttention
from .registry import registry

Placement = Literal["pre", "post"]


class TransformerBlock(nn.Module):
    """One layer. Sublayers: self-attention, cross-attention (when ``cross``), feed-forward — each
    wrapped in its own norm, residual connection and residual dropout."""

    def __init__(self, dim: int, attention: AttentionConfig, ffn: dict, norm: dict,
                 placement: Placement = "pre", dropout: float = 0.0, *, cross: bool = False,
                 memory_dim: int | None = None, cross_attention: AttentionConfig | None = None) -> None:
        super().__init__()
        reg = registry()
        self.placement = placement
        self.attn_norm = reg.create("norm", norm, dim)
        self.attn = MultiHeadAttention(dim, attention)
        if cross:
            self.cross_norm = reg.create("norm", norm, dim)
            self.cross_attn = MultiHeadAttention(dim, cross_attention or attention, cross=True,
                                                 memory_dim=memory_dim)
        self.ffn_norm = reg.create("norm", norm, dim)
        self.ffn = reg.create("ffn", ffn, dim)
        self.dropout = nn.Dropout(dropout)

    def _residual(self, x: Tensor, norm: nn.Module, sublayer) -> Tensor:
        if self.placement == "pre":
            return x + self.dropout(sublayer(norm(x)))
        return norm(x + self.dropout(sublayer(x)))

    def forward(self, x: Tensor, inputs: AttentionInputs, layer: int = 0, memory: Tensor | None = None,
                memory_mask: Tensor | None = None) -> Tensor:
        """x (B, T, C) -> (B, T, C); ``memory`` (B, S, C_m) for cross-attention layers."""
        x = self._residual(x, self.attn_norm, lambda h: self.attn(h, inputs, layer))
        if memory is not None:
            x = self._residual(x, self.cross_norm, lambda h: self.cross_attn.attend_memory(
                h, memory, memory_mask, inputs.cache, layer))
        return self._residual(x, self.ffn_norm, self.ffn)
