"""Gated linear attention in plain PyTorch, for the ``gla`` mixer (not a mixer of its own): the
chunked form for sequences, the one-token step for decoding, and flash-linear-attention's Triton
kernels on CUDA when ``fla`` is installed.

    S_t = Diag(α_t) S_{t−1} + k_t v_tᵀ,    o_t = S_tᵀ q_t · s            (per head)

α_t = exp(g_t) with g_t ≤ 0 either per key channel (GLA) or one fixed rate per head (lightning
attention). ``seqzoo.reference.gla`` is the same recurrence token by token.

A fixed rate per head is Mamba-2's SSD with keys as B, queries as C and values as x, so that case
runs ``_ssd``'s chunked scan, as ``linear_attention``'s decay does. A decay per key channel keeps
the channel inside the q·k sums. Within a chunk of L tokens, with Γ_t = Σ_{s≤t} g_s (≤ 0, per
channel) and S_0 the state before it:

    o_t = (e^{Γ_t} ⊙ q_t)ᵀ S_0 + Σ_{s≤t} (Σ_d q_td k_sd e^{Γ_td − Γ_sd}) v_s
    S_L = Diag(e^{Γ_L}) S_0 + Σ_s (e^{Γ_L − Γ_s} ⊙ k_s) v_sᵀ

The pairs Σ_d q_td k_sd e^{Γ_td − Γ_sd} are ``_delta_rule.channel_pairs``' P (KDA needs the same
pairs): every exponent is a difference Γ_t − Γ_s ≤ 0, taken through a midpoint, so none overflows
whatever the decay and no (L × L × D_k) tensor is built. The intra-chunk products run for every
chunk at once; only the carry S steps chunk by chunk. Padded positions carry g = 0 and v = 0.

Shape legend: B batch, T length, H heads, D_k key width, D_v value width, N chunks of L tokens.
"""
from __future__ import annotations

import functools
import os

import torch
from torch import Tensor

from ._chunks import in_chunks
from ._delta_rule import channel_pairs
from ._ssd import ssd_scan


def chunked(q: Tensor, k: Tensor, v: Tensor, g: Tensor, state: Tensor | None, chunk: int) -> tuple[Tensor, Tensor]:
    """The chunked form with a decay per key channel. q (scaled), k (B, T, H, D_k); v (B, T, H, D_v);
    g (B, T, H, D_k) ≤ 0; state (B, H, D_k, D_v) or None -> (o (B, T, H, D_v), S_T), in float32 or
    wider."""
    dtype = torch.promote_types(v.dtype, torch.float32)
    length = q.shape[1]
    q, k, v, g = (in_chunks(t.to(dtype), chunk).movedim(2, 3) for t in (q, k, v, g))  # (B, N, H, L, ...)
    cum = g.cumsum(-2)                                                    # Γ (B, N, H, L, D_k)
    _, pairs = channel_pairs(q, k, cum)                                   # (B, N, H, L, L)
    inside = pairs @ v                                                    # every chunk's own tokens
    q = q * cum.exp()                                                     # reads S_0 through e^{Γ_t}
    k = k * (cum[..., -1:, :] - cum).exp()                                # writes S_L through e^{Γ_L − Γ_s}
    total = cum[..., -1, :].exp()[..., None]                              # e^{Γ_L} (B, N, H, D_k, 1)
    S = v.new_zeros(v.shape[0], v.shape[2], q.shape[-1], v.shape[-1]) if state is None else state.to(dtype)
    outs = []
    # One unbind, not a slice per chunk: the backward of x[:, n] writes a zero gradient of the
    # whole length for every chunk, an unbind's backward stacks once.
    for q_n, k_n, v_n, total_n, inside_n in zip(*(t.unbind(1) for t in (q, k, v, total, inside))):
        outs.append(inside_n + q_n @ S)
        S = S * total_n + k_n.transpose(-1, -2) @ v_n
    o = torch.stack(outs, 1).movedim(3, 2).flatten(1, 2)               # (B, N·L, H, D_v)
    return o[:, :length], S


def step(q: Tensor, k: Tensor, v: Tensor, g: Tensor, S: Tensor) -> tuple[Tensor, Tensor]:
    """One token, for decoding: q (scaled), k (B, H, D_k); v (B, H, D_v); g (B, H, D_k) or (B, H);
    S (B, H, D_k, D_v) -> (o (B, H, D_v), new S), in S's dtype."""
    q, k, v, g = (t.to(S.dtype) for t in (q, k, v, g))
    decay = g.exp()
    S = S * (decay[..., None] if decay.dim() == 3 else decay[..., None, None]) + k[..., None] * v[..., None, :]
    return torch.einsum("bhkv,bhk->bhv", S, q), S


@functools.cache
def _fla_kernels(per_channel: bool) -> tuple | None:
    """fla's (chunk, fused_recurrent, name of the recurrent kernel's decay argument) for a decay
    per key channel or per head, or None."""
    try:
        if per_channel:
            from fla.ops.gla import chunk_gla, fused_recurrent_gla
            return chunk_gla, fused_recurrent_gla, "gk"
        from fla.ops.simple_gla import chunk_simple_gla, fused_recurrent_simple_gla
        return chunk_simple_gla, fused_recurrent_simple_gla, "g"
    except ImportError:
        return None


def gated_linear_attention(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor, state: Tensor | None, chunk: int,
                           scale: float, steps: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The recurrence over q, k (B, T, H, D_k), v (B, T, H, D_v) (0 at padded positions), from
    ``state`` (B, H, D_k, D_v) float32 or None -> (o (B, T, H, D_v), final state float32 or wider).
    ``log_decay``: (B, T, H, D_k) ≤ 0, per key channel (0 at padded positions); or (H,) ≤ 0, a
    fixed rate per head, taken ``steps`` (B, T, H) times at each token (1, or 0 at padded
    positions). On CUDA with fla installed (and ``SEQZOO_SCAN`` not ``torch``), fla's kernels (its
    fused recurrent one for a decode step without autograd); else one step for a single token with
    a state, the chunked form otherwise."""
    decode = q.shape[1] == 1 and state is not None
    per_channel = steps is None
    kernels = _fla_kernels(per_channel) if q.is_cuda and os.environ.get("SEQZOO_SCAN") != "torch" else None
    if kernels is not None:
        g = log_decay.float() if per_channel else steps.float() * log_decay.float()
        if decode and not torch.is_grad_enabled():  # fused_recurrent: no backward
            return kernels[1](q, k, v, **{kernels[2]: g}, scale=scale, initial_state=state, output_final_state=True)
        return kernels[0](q, k, v, g=g, scale=scale, initial_state=state, output_final_state=True)
    dtype = torch.promote_types(q.dtype, torch.float32)
    with torch.autocast(q.device.type, enabled=False):  # the products stay in float32 under autocast too
        q, k, v, log_decay = q.to(dtype) * scale, k.to(dtype), v.to(dtype), log_decay.to(dtype)
        if decode:
            g = log_decay[:, 0] if per_channel else steps[:, 0].to(dtype) * log_decay
            o, final = step(q[:, 0], k[:, 0], v[:, 0], g, state)
            return o[:, None], final
        if per_channel:
            return chunked(q, k, v, log_decay, state, chunk)
        # A fixed rate per head is SSD's decay; SSD's state is (B, H, D_v, D_k), Sᵀ.
        o, final = ssd_scan(v, steps.to(dtype), log_decay, k, q, None if state is None else state.mT, chunk)
        return o, final.mT
