"""Residual Transformer blocks and the stack that runs them.

``placement: pre`` (GPT-2, LLaMA, T5): x <- x + F(norm(x)), with a final norm after the stack.
``placement: post`` (Vaswani 2017, BERT): x <- norm(x + F(x)).
"""
from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from .attention import (AttentionConfig, AttentionInputs, MultiHeadAttention, self_attention_inputs,
                        static_attention_inputs)
from .cache import KVCache
from .errors import InputError
from .registry import registry

Placement = Literal["pre", "post"]


def check_position_limit(limit: int | None, tokens: int) -> None:
    """A sequence of ``tokens`` must fit a learned position table of ``limit`` rows (None: any)."""
    if limit is not None and tokens > limit:
        raise InputError(f"sequence of {tokens} tokens exceeds the {limit} positions of the "
                         f"learned position table (model.max_seq_len={limit})")


class TransformerBlock(nn.Module):
    """One layer. Sublayers: self-attention, cross-attention (when ``cross``), feed-forward — each
    wrapped in its own norm, residual connection and residual dropout."""

    def __init__(self, dim: int, attention: AttentionConfig, ffn: dict, norm: dict,
                 placement: Placement = "pre", dropout: float = 0.0, *, cross: bool = False,
                 memory_dim: int | None = None) -> None:
        super().__init__()
        reg = registry()
        self.placement = placement
        self.attn_norm = reg.create("norm", norm, dim)
        self.attn = MultiHeadAttention(dim, attention)
        if cross:
            self.cross_norm = reg.create("norm", norm, dim)
            self.cross_attn = MultiHeadAttention(dim, attention, cross=True, memory_dim=memory_dim)
        self.ffn_norm = reg.create("norm", norm, dim)
        self.ffn = reg.create("ffn", ffn, dim)
        self.dropout = nn.Dropout(dropout)

    def _residual(self, x: Tensor, norm: nn.Module, sublayer) -> Tensor:
        if self.placement == "pre":
            return x + self._drop(sublayer(norm(x)))
        return norm(x + self._drop(sublayer(x)))

    def _drop(self, x: Tensor) -> Tensor:
        # Skipping the module call when it cannot change anything saves per-token overhead.
        return self.dropout(x) if self.training and self.dropout.p > 0 else x

    def forward(self, x: Tensor, inputs: AttentionInputs, layer: int = 0, memory: Tensor | None = None,
                memory_mask: Tensor | None = None) -> Tensor:
        """x (B, T, C) -> (B, T, C); ``memory`` (B, S, C_m) for cross-attention layers."""
        x = self._residual(x, self.attn_norm, lambda h: self.attn(h, inputs, layer))
        if memory is not None:
            x = self._residual(x, self.cross_norm, lambda h: self.cross_attn.attend_memory(
                h, memory, memory_mask, inputs.cache, layer))
        return self._residual(x, self.ffn_norm, self.ffn)


class TransformerStack(nn.Module):
    """A stack of blocks with its own position scheme (shared by its layers): embedding-side
    position hook, optional embedding norm, dropout, the blocks and — for pre-norm — a final norm.

    ``causal`` stacks (decoders) mask future keys and run their position scheme in causal mode;
    ``cross`` stacks attend to an encoder memory in every block.
    """

    def __init__(self, dim: int, layers: int, max_seq_len: int, attention: AttentionConfig,
                 ffn: dict, norm: dict, position: dict, placement: Placement = "pre",
                 dropout: float = 0.0, *, causal: bool, cross: bool = False,
                 embed_norm: dict | None = None) -> None:
        super().__init__()
        reg = registry()
        self.causal = causal
        self.window = attention.window
        self.heads = attention.heads
        self.kv_heads = attention.kv_heads or attention.heads
        self.head_dim = attention.head_dim or dim // attention.heads
        self.position = reg.create("position", position, dim, self.head_dim, self.heads, max_seq_len)
        self.position.causal = causal
        self.embed_norm = reg.create("norm", embed_norm, dim) if embed_norm else nn.Identity()
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            TransformerBlock(dim, attention, ffn, norm, placement, dropout, cross=cross)
            for _ in range(layers)
        )
        # Post-norm blocks end in a norm already; pre-norm stacks need one at the top.
        self.final_norm = reg.create("norm", norm, dim) if placement == "pre" else nn.Identity()

    def new_cache(self, batch: int, max_len: int, *, device: torch.device, dtype: torch.dtype) -> KVCache:
        return KVCache(len(self.blocks), batch, self.kv_heads, self.head_dim, max_len,
                       device=device, dtype=dtype)

    def positions(self, t: int, *, attention_mask: Tensor | None, cache: KVCache | None,
                  device: torch.device) -> Tensor:
        """Absolute positions (B|1, T) of T new tokens: after the cached ones, or counting only
        real tokens when a (left-)padding mask (B, S) is given."""
        if attention_mask is not None:
            return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, -t:]
        past = cache.length if cache is not None else 0
        return torch.arange(past, past + t, device=device)[None]

    def forward(self, x: Tensor, *, attention_mask: Tensor | None = None,
                positions: Tensor | None = None, cache: KVCache | None = None,
                memory: Tensor | None = None, memory_mask: Tensor | None = None) -> Tensor:
        """Token embeddings x (B, T, C) -> hidden states (B, T, C).

        attention_mask (B, S): 1 for real tokens over all S = cached + T keys. positions (B|1, T)
        default to ``self.positions``. memory (B, S_m, C) and memory_mask (B, S_m) feed the
        cross-attention of ``cross`` stacks.
        """
        t = x.shape[1]
        static = cache is not None and cache.slot is not None
        if static:
            # A static decode step (see KVCache.make_static): the caller checked room and limits
            # and passes the positions; nothing here may depend on the cache's Python length.
            if t != 1 or positions is None:
                raise InputError("a static KV cache decodes one token per step at given positions")
        else:
            past = cache.length if cache is not None else 0
            if cache is not None:
                cache.check_room(t)
            check_position_limit(self.position.max_positions, past + t)
            if positions is None:
                positions = self.positions(t, attention_mask=attention_mask, cache=cache, device=x.device)
        x = self.drop(self.embed_norm(self.position.embed(x, positions)))
        if static:
            inputs = static_attention_inputs(self.position, positions, cache, window=self.window)
        else:
            inputs = self_attention_inputs(self.position, positions, causal=self.causal, cache=cache,
                                           key_padding=attention_mask, window=self.window)
        cross_mask = memory_mask.bool()[:, None, None, :] if memory_mask is not None else None
        for layer, block in enumerate(self.blocks):
            x = block(x, inputs, layer, memory, cross_mask)
        if cache is not None and not static:
            cache.advance(positions)
        return self.final_norm(x)
