"""Gated linear attention, token by token: GLA (Yang et al., 2024, "Gated Linear Attention
Transformers with Hardware-Efficient Training") decays each key channel of its state at its own,
token-dependent rate; MiniMax-01's lightning attention (MiniMax, 2025) decays each head at a fixed
rate, as RetNet (Sun et al., 2023) does. Both are one recurrence over a (D_k × D_v) state per head:

    S_t = Diag(α_t) S_{t−1} + k_t v_tᵀ,    o_t = S_tᵀ q_t · s

α_t = exp(g_t): g_t a vector over the D_k key channels (GLA), or one scalar per head (applied to
every channel). Unlike linear attention's elu + 1 form there is no normaliser: the layers
normalise o_t afterwards (an RMSNorm per head or over all heads).

Shape legend: B batch, T length, H heads, D_k key width, D_v value width. Written to be read, not
to be fast: one Python step per token.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..errors import InputError


def gla(q: Tensor, k: Tensor, v: Tensor, g: Tensor, *, scale: float | None = None,
        state: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Gated linear attention over T tokens:

        S_t = Diag(exp(g_t)) S_{t−1} + k_t v_tᵀ,    o_t = S_tᵀ q_t · s

    q, k (B, T, H, D_k); v (B, T, H, D_v); g, the log-decay, ≤ 0 for a decay: (B, T, H, D_k) (one
    per key channel: GLA) or (B, T, H) (one per head: lightning attention, RetNet). scale: s (None:
    D_k^−½). state S_0 (B, H, D_k, D_v) (None: zeros). Returns (o (B, T, H, D_v), S_T). A token
    with g = 0 and v = 0 leaves the state as it was.
    """
    batch, length, heads, width = k.shape
    if g.shape not in (k.shape, k.shape[:3]):
        raise InputError(f"reference.gla: g has shape {tuple(g.shape)}; give (B, T, H, D_k) = {tuple(k.shape)} "
                         f"(a decay per key channel) or (B, T, H) = {tuple(k.shape[:3])} (one per head)")
    scale = width ** -0.5 if scale is None else scale
    S = v.new_zeros(batch, heads, width, v.shape[-1]) if state is None else state
    outs = []
    for t in range(length):
        decay = torch.exp(g[:, t])                                               # (B, H, D_k) or (B, H)
        S = S * (decay[..., None] if decay.dim() == 3 else decay[..., None, None])
        S = S + k[:, t, :, :, None] * v[:, t, :, None, :]                        # k_t v_tᵀ (B, H, D_k, D_v)
        outs.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t]) * scale)
    return torch.stack(outs, dim=1), S
