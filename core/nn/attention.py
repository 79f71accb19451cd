"""Multi-head attention as a token mixer: projections, grouped KV heads, masks, the KV slice of
the decode cache, and the position hooks.

The score component decides how queries meet keys (``attend``); the position scheme rotates q/k
and adds biases. Everything that depends only on positions (masks, key positions, the scheme's
prepared tables) is computed once per forward per distinct configuration, in a ``MixerContext``
built by ``self_attention_inputs``, and shared by every layer of that configuration. The parts
(score, QK norms) are built by the caller and handed in.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ..errors import InputError
from ..functional import default_scale, expand_kv, masked_softmax_attend, softcap
from ..interfaces import MaskSpec, Mixer, MixerContext, PositionBias, PositionScheme, ScoreFunction, distance_table
from ..schema import Depth, PositiveFloat, PositiveInt, Probability, SchemaError, Size, Spec
from . import blocked, flex
from .blocked import BlockedPlan
from .cache import DecodeCache, KVSlice
from .linear import Linear

#: Training on the materialised path (where flex cannot run: the CPU) splits a sequence of at
#: least ``BLOCKWISE_FROM`` queries into blocks, each against only the keys its mask can reach,
#: and recomputes each block in the backward instead of keeping its logits: memory grows with the
#: block, not with T. A block holds ``BLOCK_QUERIES`` queries, halved (down to ``MIN_BLOCK``)
#: while its queries × keys exceed ``BLOCK_LOGITS``: a windowed layer keeps large blocks, a fully
#: causal one takes smaller ones as its keys grow (measured in docs/performance.md).
BLOCKWISE_FROM = 2048
BLOCK_QUERIES = 512
MIN_BLOCK = 64
BLOCK_LOGITS = 256 * 8192


@dataclass(frozen=True)
class AttentionConfig:
    """The ``attention:`` section of a recipe.

    heads: query heads H. kv_heads: key/value heads K (null = heads; 1 = MQA; else GQA, H % K == 0).
    head_dim: D (null = dim // heads). score: the score component (default ``scaled_dot``).
    bias: biases on the q/k/v projections, and on the output projection unless ``out_bias`` says
    otherwise (null = same as bias; Qwen2 has q/k/v biases but none on the output). window:
    sliding window W — a query sees itself and the W - 1 keys before it (null = unlimited); in a
    bidirectional (encoder) stack the window is symmetric: keys j with |i - j| < W, so W - 1 on
    each side (ModernBERT's local_attention L is W = L // 2 + 1).
    dropout: on attention weights while training.
    qk_norm: a norm applied to q and k before the position hook, or null; qk_norm_scope says over
    what: ``head`` — each head's D features, one weight shared by the heads (Qwen3, Gemma 3) —
    or ``projection`` — the whole H·D (K·D for keys) projection before it is split into heads
    (OLMo 2). softcap: cap the attention logits at c·tanh(z/c) after scaling, before the mask
    (Gemma 2; null = off). sinks: a learned logit per head that joins the softmax denominator
    and attends to nothing (gpt-oss; false). output_gate: multiply the heads' outputs by σ(W_g x)
    before the output projection, W_g (C -> H·D) the layer's ``gate_proj`` (Qwen3-Next; false).
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
    qk_norm_scope: Literal["head", "projection"] = "head"
    softcap: PositiveFloat | None = None
    sinks: bool = False
    output_gate: bool = False


def check_attention(attention: dict, dim: int, path: tuple) -> None:
    """Cross-field rules of an attention section (raises SchemaError at the offending key)."""
    heads, kv_heads = attention["heads"], attention["kv_heads"]
    if kv_heads is not None and heads % kv_heads:
        raise SchemaError((*path, "kv_heads"), f"heads={heads} must be divisible by kv_heads={kv_heads}")
    if attention["head_dim"] is None and dim % heads:
        raise SchemaError((*path, "heads"), f"dim={dim} must be divisible by heads={heads} (or set head_dim)")


def self_attention_inputs(
    position: PositionScheme,
    q_pos: Tensor,
    *,
    causal: bool,
    cache: DecodeCache | None = None,
    key_padding: Tensor | None = None,
    window: int | None = None,
    prepared: dict | None = None,
    documents: Tensor | None = None,
) -> MixerContext:
    """Positions and mask for self-attention over ``T`` new tokens after ``cache.length`` cached ones.

    q_pos (B|1, T); key_padding (B, S) with True/1 for real tokens over *all* S keys (cached + new).
    Causality is by slot (bottom-right aligned when there is a cache); the window counts slots too.
    ``prepared``: the scheme's prepared tables from another context of this forward (another
    window), so they are not computed again. ``documents`` (B, T): the packed document of each
    token (no cache); a query reads only keys of its own document.
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
    padding = key_padding[:, -t:] if key_padding is not None else None
    if key_padding is None and window is None and documents is None:
        if not causal or t == 1:
            # Nothing to hide: no causality, or one new token that may see every earlier key.
            return MixerContext(position, q_pos, k_pos, None, False, cache, prepared=prepared)
        if past == 0:
            # The kernel's own top-left causal mask is exact when nothing is cached (fused path).
            return MixerContext(position, q_pos, k_pos, None, True, cache, prepared=prepared)
    if documents is not None and past:
        raise InputError("document masks are for training on packed rows, not for decoding with a cache")
    spec = MaskSpec(t, s, past, causal, window, None if key_padding is None else key_padding.bool(), documents,
                    device=device)
    # The mask is built when a layer reads it (MaskSpec): flex and the blockwise path never do.
    return MixerContext(position, q_pos, k_pos, None, False, cache, padding=padding, prepared=prepared,
                        mask_spec=spec)


def static_attention_inputs(position: PositionScheme, q_pos: Tensor, cache: DecodeCache, *,
                            window: int | None = None, prepared: dict | None = None) -> MixerContext:
    """One new token per row at the ``slot`` of a static cache (``cache.write_static`` already
    marked it valid): it attends over all max_len slots, masked to the valid ones (causality holds
    by construction: later slots are not valid yet). Fixed shapes and no Python number read from
    the cache, so a compiled decode step never recompiles. q_pos (B|1, 1)."""
    valid = cache.valid  # (B, max_len)
    if window is not None:
        slots = torch.arange(cache.max_len, device=valid.device)
        valid = valid & (cache.slot - slots < window)
    return MixerContext(position, q_pos, cache.positions, valid[:, None, None, :], False, cache, static=True,
                        prepared=prepared)


class MultiHeadAttention(Mixer):
    """Multi-head attention with H query heads and K key/value heads (MHA, GQA, MQA), as a mixer,
    configured by one ``AttentionConfig`` (a recipe's ``attention:`` section) with its parts built.

    Self-attention uses one fused q/k/v projection; cross-attention (``cross``) projects queries
    from x and keys/values from the memory. ``score`` is a ``ScoreFunction`` over per-head dims D;
    ``q_norm``/``k_norm`` (QK-norm) act per head (over D) or, with ``qk_norm_scope="projection"``,
    over the whole projection (over H·D and K·D). ``window``: the sliding window the owning stack
    masks with. ``softcap``: c·tanh(z/c) on the logits (then the explicit softmax path runs, as
    fused kernels have no softcap); ``sinks``: a learned per-head logit in every softmax
    denominator (gpt-oss). Long self-attention that would materialise its logits (a softcap, sinks,
    a position bias or a mask) runs through FlexAttention where it can (``seqzoo.nn.flex``).
    """

    reads_mask = True
    residual_projections = ("out_proj",)

    def __init__(self, dim: int, config: AttentionConfig, *, score: ScoreFunction, q_norm: nn.Module | None = None,
                 k_norm: nn.Module | None = None, cross: bool = False, memory_dim: int | None = None) -> None:
        super().__init__(dim)
        self.heads = config.heads
        self.kv_heads = config.kv_heads or config.heads
        self.head_dim = config.head_dim or dim // config.heads
        self.window = config.window
        self.dropout = config.dropout
        self.cross = cross
        self.softcap = config.softcap
        self.qk_norm_scope = config.qk_norm_scope
        h, k, d, bias = self.heads, self.kv_heads, self.head_dim, config.bias
        if cross:
            self.q_proj = Linear(dim, h * d, bias=bias)
            self.kv_proj = Linear(memory_dim or dim, 2 * k * d, bias=bias)
            self.stacked_rows = {"kv_proj.weight": (k * d, k * d)}
        else:
            self.qkv_proj = Linear(dim, (h + 2 * k) * d, bias=bias)
            self.stacked_rows = {"qkv_proj.weight": (h * d, k * d, k * d)}
        self.out_proj = Linear(h * d, dim, bias=bias if config.out_bias is None else config.out_bias)
        # Qwen3-Next's query projection is twice as wide, [q | g] per head; a projection of its own
        # gives the same products and keeps the fused q/k/v layout every other family shares.
        self.gate_proj = Linear(dim, h * d, bias=bias) if config.output_gate else None
        self.score = score
        self.q_norm, self.k_norm = q_norm, k_norm
        # Zero logits to start: the sink takes e^0 of the denominator, like one more zero-value key.
        self.sinks = nn.Parameter(torch.zeros(h)) if config.sinks else None

    def new_state(self, batch: int, max_len: int, *, device: torch.device | None = None,
                  dtype: torch.dtype | None = None) -> KVSlice:
        """This layer's slice of the KV cache: (B, K, max_len, D) keys and values."""
        return KVSlice(batch, self.kv_heads, self.head_dim, max_len, device=device,
                       dtype=dtype or torch.float32)

    def _heads(self, x: Tensor, n: int) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, n, self.head_dim).transpose(1, 2)  # (B, n, T, D)

    def _attend(self, q: Tensor, key: Tensor, value: Tensor, mask: Tensor | None, bias: Tensor | None,
                causal: bool) -> Tensor:
        """(B, H, T, D) queries over (B, K, S, D) keys/values -> (B, H, T, D)."""
        dropout = self.dropout if self.training else 0.0
        if self.softcap is None and self.sinks is None:
            return self.score.attend(q, key, value, mask=mask, bias=bias, causal=causal, dropout=dropout)
        logits = softcap(self.score.scores(q, expand_kv(key, q.shape[1])), self.softcap)
        return masked_softmax_attend(logits, value, mask=mask, bias=bias, causal=causal, dropout=dropout,
                                     training=self.training, sink=self.sinks)

    def _merge(self, out: Tensor, x: Tensor) -> Tensor:
        """The heads' outputs (B, H, T, D) -> (B, T, C), gated by σ(W_g x) (``output_gate``)."""
        b, _, t, _ = out.shape
        out = out.transpose(1, 2).reshape(b, t, self.heads * self.head_dim)
        if self.gate_proj is not None:
            out = out * torch.sigmoid(self.gate_proj(x))
        return self.out_proj(out)

    def forward(self, x: Tensor, context: MixerContext, state: KVSlice | None = None) -> Tensor:
        """Self-attention: x (B, T, C) -> (B, T, C), reading and extending ``state``."""
        h, k, d = self.heads, self.kv_heads, self.head_dim
        q, key, value = self.qkv_proj(x).split([h * d, k * d, k * d], dim=-1)
        if self.q_norm is not None and self.qk_norm_scope == "projection":
            q, key = self.q_norm(q), self.k_norm(key)  # over H·D and K·D (OLMo 2)
        q, key, value = self._heads(q, h), self._heads(key, k), self._heads(value, k)  # (B, H|K, T, D)
        if self.q_norm is not None and self.qk_norm_scope == "head":
            q, key = self.q_norm(q), self.k_norm(key)
        position = context.position
        q, key = position.rotate(q, key, context.q_pos, context.q_pos, **context.prepared)
        if state is not None:
            key, value = state.write(context.cache, key, value)  # (B, K, S, D)
        out = self._flex(q, key, value, context)
        if out is None and q.requires_grad and q.shape[-2] >= BLOCKWISE_FROM and self._materialises(context):
            out = self._blocked(q, key, value, context)
            if out is None:
                out = self._blockwise(q, key, value, context)
        if out is None:
            bias = position.bias(q, context.q_pos, context.k_pos, **context.prepared)
            out = self._attend(q, key, value, context.mask, bias, context.causal)
        return self._merge(out, x)

    def _materialises(self, context: MixerContext) -> bool:
        """Whether this layer's attention builds (B, H, T, S) logits, a bias or a mask: a softcap,
        sinks, a position bias or a mask (plain causal attention is the fused kernel's)."""
        biased = type(context.position).bias is not PositionScheme.bias
        return self.softcap is not None or self.sinks is not None or biased or context.masked

    def _blocked(self, q: Tensor, key: Tensor, value: Tensor, context: MixerContext) -> Tensor | None:
        """Training attention that materialises (a softcap, sinks, a distance bias, a mask) in blocks
        of queries and keys with an online softmax (``seqzoo.nn.blocked``): q (B, H, T, D),
        key/value (B, K, S, D) -> (B, H, T, D); None where it does not apply (a score that is not a
        scaled dot product, dropout while training, a bias that is not a function of the distance
        between positions, such as Shaw's or XL's, which read q)."""
        score = self.score.flex()
        if score is None or score.modify is not None or (self.dropout and self.training):
            return None
        t, s = q.shape[-2], key.shape[-2]
        past = s - t
        causal = context.causal or context.position.causal
        position, masked = context.position, context.masked
        q_pos, k_pos = torch.atleast_2d(context.q_pos), torch.atleast_2d(context.k_pos)
        first, by_distance = 0, None
        if type(position).bias is not PositionScheme.bias:
            if not isinstance(position, PositionBias):
                return None
            first, by_distance = distance_table(position, q_pos, k_pos)
            if by_distance is None:
                return None
        rows: dict[tuple[int, int], Tensor | None] = {}  # the last query block's mask rows, built once

        def reach(start: int, stop: int) -> tuple[int, int]:
            first = max(0, past + start - self.window + 1) if causal and self.window else 0
            return first, (past + stop if causal else s)

        def visible(q0: int, q1: int, k0: int, k1: int) -> Tensor | None:
            if masked:
                if (q0, q1) not in rows:
                    rows.clear()
                    rows[(q0, q1)] = context.mask_rows(q0, q1)
                mask = rows[(q0, q1)]
                return None if mask is None else mask[..., k0:k1]
            if causal and k1 - 1 > past + q0:  # the block crosses the diagonal
                keys, queries = torch.arange(k0, k1, device=q.device), torch.arange(q0, q1, device=q.device)
                return keys[None] <= past + queries[:, None]
            return None

        def distance(q0: int, q1: int, k0: int, k1: int) -> Tensor:
            return k_pos[:, None, k0:k1] - q_pos[:, q0:q1, None] - first

        plan = BlockedPlan(default_scale(self.head_dim, score.scale), self.softcap, reach, visible, distance,
                           block=blocked.BLOCK)
        return blocked.blocked_attention(q, key, value, plan, self.sinks, by_distance)

    def _blockwise(self, q: Tensor, key: Tensor, value: Tensor, context: MixerContext) -> Tensor:
        """The materialised path one block of queries at a time (``BLOCK_QUERIES``, fewer where a
        block would read more than ``BLOCK_LOGITS`` logits), each block checkpointed: q (B, H, T,
        D), key/value (B, K, S, D) -> (B, H, T, D). A block reads the keys from its first visible
        one to its last (causality and the window bound them in a decoder)."""
        t, s = q.shape[-2], key.shape[-2]
        past = s - t  # cached keys before the first query
        causal = context.causal or context.position.causal
        # the plain causal case has no mask to slice: spell it out by parts, as the stack would
        spec = MaskSpec(t, s, past, True, device=q.device) if context.causal and not context.masked else None

        def reach(start: int, stop: int) -> tuple[int, int]:
            """The keys queries start:stop can see: [first, last)."""
            first = max(0, past + start - self.window + 1) if causal and self.window else 0
            return first, (past + stop if causal else s)

        def block_end(start: int) -> int:
            size = BLOCK_QUERIES
            while size > MIN_BLOCK:
                first, last = reach(start, min(t, start + size))
                if size * (last - first) <= BLOCK_LOGITS:
                    break
                size //= 2
            return min(t, start + size)

        outputs, start = [], 0
        while start < t:
            stop = block_end(start)
            first, last = reach(start, stop)
            q_block = q[:, :, start:stop]
            rows = spec.rows(start, stop) if spec is not None else context.mask_rows(start, stop)
            mask = None if rows is None else rows[..., first:last]
            q_pos = context.q_pos[..., start:stop]
            k_pos = context.k_pos[..., first:last]

            def block(q_block, keys, values, mask=mask, q_pos=q_pos, k_pos=k_pos):
                bias = context.position.bias(q_block, q_pos, k_pos)  # this block's bias only
                return self._attend(q_block, keys, values, mask, bias, False)

            outputs.append(checkpoint(block, q_block, key[:, :, first:last], value[:, :, first:last],
                                      use_reentrant=False))
            start = stop
        return torch.cat(outputs, dim=2)

    def _flex(self, q: Tensor, key: Tensor, value: Tensor, context: MixerContext) -> Tensor | None:
        """Self-attention through FlexAttention, or None where it does not apply: nothing would be
        materialised (plain causal attention is SDPA's), dropout, short sequences, autograd on the
        CPU, a score or a position bias with no flex form."""
        position = context.position
        biased = type(position).bias is not PositionScheme.bias
        if not self._materialises(context):
            return None
        if (self.dropout and self.training) or not flex.usable(q, key.shape[-2], grad=q.requires_grad,
                                                                    sinks=self.sinks is not None):
            return None
        score = self.score.flex()
        position_mod = position.score_mod(context.q_pos, context.k_pos, **context.prepared) if biased else None
        if score is None or (biased and position_mod is None):
            return None
        blocks = flex.block_mask(context, q.shape[-2], key.shape[-2], q.device)
        modify = flex.compose(score.modify, None if self.softcap is None else flex.softcap_mod(self.softcap),
                              position_mod)
        return flex.attend(q, key, value, scale=score.scale, score_mod=modify, blocks=blocks, sink=self.sinks)

    def attend_memory(self, x: Tensor, memory: Tensor, memory_mask: Tensor | None,
                      cache: DecodeCache | None = None, layer: int = 0) -> Tensor:
        """Cross-attention: x (B, T, C) reads memory (B, S, C_m); memory_mask (B, 1, 1, S) boolean.

        With a cache the memory's keys/values are projected once and reused for every step.
        """
        h, k, d = self.heads, self.kv_heads, self.head_dim
        q = self.q_proj(x)
        if self.q_norm is not None and self.qk_norm_scope == "projection":
            q = self.q_norm(q)
        q = self._heads(q, h)
        if self.q_norm is not None and self.qk_norm_scope == "head":
            q = self.q_norm(q)
        if cache is not None and layer in cache.memory:
            key, value = cache.memory[layer]
        else:
            key, value = self.kv_proj(memory).split([k * d, k * d], dim=-1)
            if self.k_norm is not None and self.qk_norm_scope == "projection":
                key = self.k_norm(key)
            key, value = self._heads(key, k), self._heads(value, k)
            if self.k_norm is not None and self.qk_norm_scope == "head":
                key = self.k_norm(key)
            if cache is not None:
                cache.memory[layer] = (key, value)
        return self._merge(self._attend(q, key, value, memory_mask, None, False), x)
