"""Multi-head attention: projections, grouped KV heads, masks, KV cache, and the hooks.

The score component decides how queries meet keys (``attend``); the position scheme rotates q/k
and adds biases. Everything that depends only on positions (masks, key positions) is computed once
per forward in ``AttentionInputs`` and shared by every layer.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from .cache import KVCache
from .interfaces import PositionScheme
from .linear import Linear
from .schema import Depth, PositiveInt, Probability, SchemaError, Size, Spec


@dataclass(frozen=True)
class AttentionConfig:
    """The ``attention:`` section of a recipe.

    heads: query heads H. kv_heads: key/value heads K (null = heads; 1 = MQA; else GQA, H % K == 0).
    head_dim: D (null = dim // heads). score: the score component (default ``scaled_dot``).
    bias: biases on the q/k/v projections, and on the output projection unless ``out_bias`` says
    otherwise (null = same as bias; Qwen2 has q/k/v biases but none on the output). window: sliding window W — a query sees itself
    and the W - 1 keys before it (null = unlimited). dropout: on attention weights while training.
    qk_norm: a norm applied to each head's q and k over D before the position hook (Qwen3,
    Gemma-3; weight shared across heads), or null.
    """

    heads: Depth
    kv_heads: Depth | None = None
    head_dim: Size | None = None
    score: Spec["score"] = "scaled_dot"
    bias: bool = True
    out_bias: bool | None = None
    window: PositiveInt | None = None
    dropout: Probability = 0.0
    qk_norm: Spec["norm"] | None = None


def check_attention(attention: dict, dim: int, path: tuple) -> None:
    """Cross-field rules of an attention section (raises SchemaError at the offending key)."""
    heads, kv_heads = attention["heads"], attention["kv_heads"]
    if kv_heads is not None and heads % kv_heads:
        raise SchemaError((*path, "kv_heads"), f"heads={heads} must be divisible by kv_heads={kv_heads}")
    if attention["head_dim"] is None and dim % heads:
        raise SchemaError((*path, "heads"), f"dim={dim} must be divisible by heads={heads} (or set head_dim)")


@dataclass
class AttentionInputs:
    """Per-forward attention context, shared by all layers of a stack.

    q_pos (B|1, T) and k_pos (B|1, S) are absolute positions; ``mask`` is boolean (B|1, 1, T, S),
    True where a query may attend, or None with ``causal`` telling the kernel to apply a plain
    top-left causal mask itself (no cache, no padding, no window: the fused fast path).
    """

    position: PositionScheme
    q_pos: Tensor
    k_pos: Tensor
    mask: Tensor | None
    causal: bool
    cache: KVCache | None = None
    #: ``position.prepare(q_pos, k_pos)`` as keyword arguments for its hooks ({} when unused).
    prepared: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if type(self.position).prepare is not PositionScheme.prepare:
            self.prepared = {"prepared": self.position.prepare(self.q_pos, self.k_pos)}


def self_attention_inputs(
    position: PositionScheme,
    q_pos: Tensor,
    *,
    causal: bool,
    cache: KVCache | None = None,
    key_padding: Tensor | None = None,
    window: int | None = None,
) -> AttentionInputs:
    """Positions and mask for self-attention over ``T`` new tokens after ``cache.length`` cached ones.

    q_pos (B|1, T); key_padding (B, S) with True/1 for real tokens over *all* S keys (cached + new).
    Causality is by slot (bottom-right aligned when there is a cache); the window counts slots too.
    """
    t = q_pos.shape[-1]
    past = cache.length if cache is not None else 0
    s = past + t
    device = q_pos.device
    k_pos = q_pos
    if past and type(position).bias is not PositionScheme.bias:  # only biases read key positions
        cached = cache.positions[:, :past]
        b = max(cached.shape[0], q_pos.shape[0])
        k_pos = torch.cat([cached.expand(b, past), q_pos.expand(b, t)], dim=-1)
    if key_padding is None and window is None:
        if not causal or t == 1:
            # Nothing to hide: no causality, or one new token that may see every earlier key.
            return AttentionInputs(position, q_pos, k_pos, None, False, cache)
        if past == 0:
            # The kernel's own top-left causal mask is exact when nothing is cached (fused path).
            return AttentionInputs(position, q_pos, k_pos, None, True, cache)
    q_slot = torch.arange(past, s, device=device)[:, None]
    k_slot = torch.arange(s, device=device)[None, :]
    allowed = torch.ones(t, s, dtype=torch.bool, device=device)
    if causal:
        allowed &= k_slot <= q_slot
    if window is not None:
        allowed &= (q_slot - k_slot) < window
    mask = allowed[None, None]
    if key_padding is not None:
        mask = mask & key_padding.bool()[:, None, None, :]
    return AttentionInputs(position, q_pos, k_pos, mask, False, cache)


def static_attention_inputs(position: PositionScheme, q_pos: Tensor, cache: KVCache, *,
                            window: int | None = None) -> AttentionInputs:
    """One new token per row, written at the ``slot`` of a static cache: it attends over all
    max_len slots, masked to the valid ones (causality holds by construction: later slots are
    not valid yet). Fixed shapes and no Python number read from the cache, so a compiled decode
    step never recompiles. q_pos (B|1, 1)."""
    valid = cache.write_static(q_pos)  # (B, max_len)
    if window is not None:
        slots = torch.arange(cache.max_len, device=valid.device)
        valid = valid & (cache.slot - slots < window)
    return AttentionInputs(position, q_pos, cache.positions, valid[:, None, None, :], False, cache)


class MultiHeadAttention(nn.Module):
    """Multi-head attention with H query heads and K key/value heads (MHA, GQA, MQA).

    Self-attention uses one fused q/k/v projection; cross-attention projects queries from x and
    keys/values from the memory. The score is a registered ``score`` component (per-head dims D).
    """

    def __init__(self, dim: int, attention: AttentionConfig, *, cross: bool = False,
                 memory_dim: int | None = None) -> None:
        super().__init__()
        from .registry import registry

        self.heads = attention.heads
        self.kv_heads = attention.kv_heads or attention.heads
        self.head_dim = attention.head_dim or dim // attention.heads
        self.dropout = attention.dropout
        self.cross = cross
        h, k, d = self.heads, self.kv_heads, self.head_dim
        if cross:
            self.q_proj = Linear(dim, h * d, bias=attention.bias)
            self.kv_proj = Linear(memory_dim or dim, 2 * k * d, bias=attention.bias)
        else:
            self.qkv_proj = Linear(dim, (h + 2 * k) * d, bias=attention.bias)
        out_bias = attention.bias if attention.out_bias is None else attention.out_bias
        self.out_proj = Linear(h * d, dim, bias=out_bias)
        self.score = registry().create("score", attention.score, query_dim=d, key_dim=d, heads=h)
        if attention.qk_norm is not None:
            self.q_norm = registry().create("norm", attention.qk_norm, d)
            self.k_norm = registry().create("norm", attention.qk_norm, d)
        else:
            self.q_norm = self.k_norm = None

    def _heads(self, x: Tensor, n: int) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, n, self.head_dim).transpose(1, 2)  # (B, n, T, D)

    def forward(self, x: Tensor, inputs: AttentionInputs, layer: int = 0) -> Tensor:
        """Self-attention: x (B, T, C) -> (B, T, C), reading and writing ``inputs.cache``."""
        h, k, d = self.heads, self.kv_heads, self.head_dim
        q, key, value = self.qkv_proj(x).split([h * d, k * d, k * d], dim=-1)
        q, key, value = self._heads(q, h), self._heads(key, k), self._heads(value, k)  # (B, H|K, T, D)
        if self.q_norm is not None:
            q, key = self.q_norm(q), self.k_norm(key)
        q, key = inputs.position.rotate(q, key, inputs.q_pos, inputs.q_pos, **inputs.prepared)
        if inputs.cache is not None:
            key, value = inputs.cache.write(layer, key, value)  # (B, K, S, D)
        bias = inputs.position.bias(q, inputs.q_pos, inputs.k_pos, **inputs.prepared)
        out = self.score.attend(q, key, value, mask=inputs.mask, bias=bias, causal=inputs.causal,
                                dropout=self.dropout if self.training else 0.0)
        return self.out_proj(out.transpose(1, 2).reshape(x.shape[0], x.shape[1], h * d))

    def attend_memory(self, x: Tensor, memory: Tensor, memory_mask: Tensor | None,
                      cache: KVCache | None = None, layer: int = 0) -> Tensor:
        """Cross-attention: x (B, T, C) reads memory (B, S, C_m); memory_mask (B, 1, 1, S) boolean.

        With a cache the memory's keys/values are projected once and reused for every step.
        """
        h, k, d = self.heads, self.kv_heads, self.head_dim
        q = self._heads(self.q_proj(x), h)
        if self.q_norm is not None:
            q = self.q_norm(q)
        if cache is not None and layer in cache.memory:
            key, value = cache.memory[layer]
        else:
            key, value = self.kv_proj(memory).split([k * d, k * d], dim=-1)
            key, value = self._heads(key, k), self._heads(value, k)
            if self.k_norm is not None:
                key = self.k_norm(key)
            if cache is not None:
                cache.memory[layer] = (key, value)
        out = self.score.attend(q, key, value, mask=memory_mask, causal=False,
                                dropout=self.dropout if self.training else 0.0)
        return self.out_proj(out.transpose(1, 2).reshape(x.shape[0], x.shape[1], h * d))
