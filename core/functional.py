"""The numeric kernels the interfaces' default implementations and the built-in components share:
masked softmax attention, grouped-head expansion, logit softcapping, the scale of a score, and the
step-by-step loop of a recurrent cell. Plain functions of tensors, with nothing above them: the
bottom of the core, imported by ``seqzoo.interfaces`` and everything over it.

Shape legend: B batch, H heads, K kv heads, T queries, S keys, D head dim.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor


def upcast(x: Tensor) -> Tensor:
    """x in at least float32 (half inputs are promoted, float64 is kept) for precise reductions."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def expand_kv(x: Tensor, heads: int) -> Tensor:
    """Repeat each of the K key/value heads ``heads // K`` times: (B, K, S, D) -> (B, H, S, D).

    Query head h reads kv head h // (H // K) (repeat_interleave, as HF ``repeat_kv``; tiling with
    ``repeat`` would map h to h mod K, which is wrong).
    """
    kv_heads = x.shape[1]
    if kv_heads == heads:
        return x
    return x.repeat_interleave(heads // kv_heads, dim=1)


def causal_mask(t: int, s: int, device: torch.device | None = None) -> Tensor:
    """Top-left aligned causal mask (T, S): query i may see keys 0..i (as SDPA ``is_causal``)."""
    return torch.ones(t, s, dtype=torch.bool, device=device).tril()


def masked_softmax_attend(
    logits: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None = None,
    bias: Tensor | None = None,
    causal: bool = False,
    dropout: float = 0.0,
    training: bool = False,
    sink: Tensor | None = None,
) -> Tensor:
    """softmax(logits + bias, masked) @ v with the softmax in float32 and fully masked rows -> 0.

    logits (B, H, T, S), v (B, H, S, Dv) -> (B, H, T, Dv). v may hold K < H grouped heads
    (B, K, S, Dv): query head h reads v head h // (H // K), as ``expand_kv``, without copying v.
    ``sink`` (H,): a learned logit per head that joins every row's softmax denominator, never
    masked, and attends to nothing: p_ij = e^z_ij / (e^s_h + Σ_j e^z_ij) (gpt-oss attention sinks).
    """
    probs = upcast(logits)
    if bias is not None:
        probs = probs + bias  # in float32: a bf16 sum would round large ALiBi biases
    if mask is None and causal:
        mask = causal_mask(logits.shape[-2], logits.shape[-1], logits.device)
    if mask is not None:
        probs = probs.masked_fill(~mask, float("-inf"))
    if sink is not None:
        b, heads, t, _ = probs.shape
        column = upcast(sink).view(1, heads, 1, 1).expand(b, heads, t, 1)
        # Never masked, the sink keeps every row finite: a row with no visible key puts all its
        # weight on the sink and so attends to nothing.
        probs = torch.cat([probs, column], dim=-1).softmax(dim=-1)[..., :-1]
    else:
        probs = probs.softmax(dim=-1)
        if mask is not None:
            # A row with no visible key is 0/0 = NaN after softmax; such rows attend to nothing.
            probs = probs.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    probs = probs.to(v.dtype)
    if dropout > 0.0 and training:
        probs = F.dropout(probs, p=dropout)
    b, heads, t, s = probs.shape
    if v.shape[1] != heads:  # the H // K query heads of each kv head are consecutive
        return (probs.reshape(b, v.shape[1], heads // v.shape[1] * t, s) @ v).view(b, heads, t, v.shape[-1])
    return probs @ v


def default_scale(head_dim: int, scale: float | None) -> float:
    """The logit scale a score uses: ``scale`` when given, else 1/sqrt(D) (Vaswani 2017)."""
    return 1.0 / math.sqrt(head_dim) if scale is None else scale


def softcap(x: Tensor, cap: float | None) -> Tensor:
    """cap · tanh(x / cap) (Gemma 2's logit softcapping), or x when ``cap`` is None."""
    return x if cap is None else torch.tanh(x / cap) * cap


def step_through(step: Callable, x: Tensor, state, lengths: Tensor | None = None):
    """A recurrent cell run step by step: ``step(x_t, state) -> (h_t, state)`` over x (B, T, I) ->
    (h_all (B, T, H), final state). With ``lengths`` (B,) int64 a row's state stops changing after
    its last real step and its outputs at padded positions are zeros."""
    outputs = []
    for t in range(x.shape[1]):
        h_t, new = step(x[:, t], state)
        if lengths is not None:
            live = (t < lengths)[:, None]  # (B, 1): rows still inside their sequence
            h_t = torch.where(live, h_t, torch.zeros_like(h_t))
            new = (torch.where(live, new, state) if isinstance(new, Tensor)
                   else tuple(torch.where(live, n, o) for n, o in zip(new, state)))
        state = new
        outputs.append(h_t)
    return torch.stack(outputs, dim=1), state
