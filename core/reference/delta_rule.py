"""The delta rule, token by token: DeltaNet (Yang et al., 2024), gated DeltaNet (Yang, Kautz &
Hatamizadeh, 2025) and Kimi Delta Attention (Kimi Team, 2025) are one recurrence that differs only
in the decay α_t of the state before each write:

    S_t = Diag(α_t) S_{t−1} + β_t k_t (v_t − (Diag(α_t) S_{t−1})ᵀ k_t)ᵀ,    o_t = S_tᵀ q_t · s

— a (D_k × D_v) state per value head that, at each token, decays, reads what it holds for key k_t,
and moves that read a fraction β_t of the way to v_t (one step of online regression, S ← S −
β ∇_S ½‖Sᵀk − v‖²). α_t = 1 is DeltaNet; α_t = exp(g_t), one scalar per head, is gated DeltaNet;
α_t = exp(g_t) with g_t a vector over the D_k key channels is KDA. Equivalently, with the decay
applied first: S ← Diag(α) S, then S ← (I − β k kᵀ) S + β k vᵀ.

Shape legend: B batch, T length, G key heads (q and k), H value heads (v, β, g and the state; each
key head serves H / G consecutive value heads, "grouped value attention"), D_k key width, D_v value
width. Written to be read, not to be fast: one Python step per token.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..errors import InputError


def delta_rule(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor | None = None, *,
               scale: float | None = None, state: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The (gated) delta rule over T tokens:

        S_t = Diag(exp(g_t)) S_{t−1}
        S_t = S_t + k_t (β_t (v_t − S_tᵀ k_t))ᵀ,    o_t = S_tᵀ q_t · s

    q, k (B, T, G, D_k), used as given (the layers L2-normalise them first); v (B, T, H, D_v);
    beta (B, T, H); g: None (no decay: DeltaNet), (B, T, H) (a scalar log-decay per head: gated
    DeltaNet) or (B, T, H, D_k) (one per key channel: KDA), ≤ 0 for a decay. scale: s (None:
    D_k^−½). state S_0 (B, H, D_k, D_v) (None: zeros). Returns (o (B, T, H, D_v), S_T). A token
    with β = 0 and g = 0 leaves the state as it was.
    """
    batch, length, key_heads, width = k.shape
    heads = v.shape[2]
    if heads % key_heads:
        raise InputError(f"reference.delta_rule: value heads={heads} (v's dim 2) must be a multiple of key "
                         f"heads={key_heads} (k's dim 2); give each key head the same number of value heads")
    scale = width ** -0.5 if scale is None else scale
    q, k = q.repeat_interleave(heads // key_heads, 2), k.repeat_interleave(heads // key_heads, 2)  # (B, T, H, D_k)
    S = v.new_zeros(batch, heads, width, v.shape[-1]) if state is None else state
    outs = []
    for t in range(length):
        if g is not None:
            decay = torch.exp(g[:, t])                                           # (B, H) or (B, H, D_k)
            S = S * (decay[..., None, None] if decay.dim() == 2 else decay[..., None])
        read = torch.einsum("bhkv,bhk->bhv", S, k[:, t])                        # what S holds for k_t
        delta = beta[:, t, :, None] * (v[:, t] - read)                         # (B, H, D_v)
        S = S + k[:, t, :, :, None] * delta[:, :, None, :]
        outs.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t]) * scale)
    return torch.stack(outs, dim=1), S
