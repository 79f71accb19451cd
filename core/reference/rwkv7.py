"""RWKV-7 "Goose" (Peng, Zhang, Goldstein et al., 2025, "RWKV-7 'Goose' with Expressive Dynamic
State Evolution"), token by token: the generalised delta rule at its heart, the whole time-mix
layer around it, and the channel mix. No other library ships RWKV-7 for PyTorch's CPU (transformers
has RWKV-4 only), so these, written from the paper's equations and the authors' RWKV-LM code
(``RWKV-v7``'s ``RWKV_Tmix_x070`` and ``RWKV_CMix_x070``), are the mixers' reference.

The state is kept as S (D_k × D_v) per head, the transpose of the paper's wkv state (D_v × D_k), as
every state in ``seqzoo.reference`` and in flash-linear-attention; the paper's

    wkv_t = wkv_{t−1} (Diag(w_t) − κ̂_t (a_t ⊙ κ̂_t)ᵀ) + v_t k̃_tᵀ,    o_t = wkv_t r_t

reads, transposed,

    S_t = Diag(w_t) S_{t−1} − (a_t ⊙ κ̂_t)(κ̂_tᵀ S_{t−1}) + k̃_t v_tᵀ,    o_t = S_tᵀ r_t

— the state decays per key channel, then gives up a fraction a_t of what it holds along the unit
removal key κ̂_t (the removal reads the state before the decay), then takes the new value under
the replacement key k̃_t. With w = 1, a = β and κ̂ = k̃ = k it is the delta rule (v scaled by β).

Shape legend: B batch, T length, H heads, D_k key width, D_v value width, C model width (H·D_k),
C_v = H·D_v, F the channel mix's hidden width. Written to be read, not to be fast.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor


def _wkv_step(S: Tensor, r: Tensor, w: Tensor, k: Tensor, v: Tensor, kappa: Tensor,
              a: Tensor) -> tuple[Tensor, Tensor]:
    """One token: S (B, H, D_k, D_v); r, w, k, kappa, a (B, H, D_k); v (B, H, D_v) -> (o_t, S_t)."""
    held = torch.einsum("bhk,bhkv->bhv", kappa, S)                     # κ̂ᵀ S: what S holds along κ̂
    S = w[..., None] * S - (a * kappa)[..., None] * held[..., None, :] + k[..., None] * v[..., None, :]
    return torch.einsum("bhkv,bhk->bhv", S, r), S


def generalized_delta_rule(r: Tensor, w: Tensor, k: Tensor, v: Tensor, kappa: Tensor, a: Tensor, *,
                           state: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """RWKV-7's recurrence over T tokens:

        S_t = Diag(w_t) S_{t−1} − (a_t ⊙ κ̂_t)(κ̂_tᵀ S_{t−1}) + k_t v_tᵀ,    o_t = S_tᵀ r_t

    r, k (B, T, H, D_k), used as given (the layer has already made k the replacement key k̃);
    w (B, T, H, D_k) the decay in (0, 1] (not its log); kappa κ̂ (B, T, H, D_k), unit length per
    head in the layer; a (B, T, H, D_k) the in-context learning rate in (0, 1); v (B, T, H, D_v);
    state S_0 (B, H, D_k, D_v) (None: zeros). Returns (o (B, T, H, D_v), S_T). A token with w = 1
    and k = κ̂ = 0 leaves the state as it was.
    """
    S = v.new_zeros(v.shape[0], v.shape[2], k.shape[-1], v.shape[-1]) if state is None else state
    outs = []
    for t in range(v.shape[1]):
        o, S = _wkv_step(S, r[:, t], w[:, t], k[:, t], v[:, t], kappa[:, t], a[:, t])
        outs.append(o)
    return torch.stack(outs, dim=1), S


def rwkv7_time_mix(x: Tensor, weights: dict[str, Tensor], heads: int, *, v_first: Tensor | None = None,
                   eps: float = 64e-5,
                   state: tuple[Tensor, Tensor] | None = None) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
    """The RWKV-7 time-mix layer, one token at a time, with the authors' tensors (RWKV-LM's
    ``RWKV_Tmix_x070``; the (1, 1, C) ones given as (C,)): ``x_r x_w x_k x_v x_a x_g`` the token-shift
    mixes; ``w0 w1 w2``, ``a0 a1 a2``, ``v0 v1 v2`` and ``g1 g2`` the low-rank MLPs (w1 (C, R), w2
    (R, C): x @ w1 @ w2); ``k_k k_a`` (C,); ``r_k`` (H, D_k); ``receptance key value output`` the
    projections (out × in, as nn.Linear); ``ln_x.weight ln_x.bias`` (C_v,) the per-head GroupNorm.

        x^□ = x_t + (x_{t−1} − x_t) ⊙ x_□                     for □ in r, w, k, v, a, g
        r = receptance(x^r),  k = key(x^k),  v = value(x^v)
        w = exp(−e^{−½} σ(w0 + tanh(x^w w1) w2))              the decay, in (e^{−e^{−½}}, 1)
        v ← v + (v_first − v) ⊙ σ(v0 + x^v v1 v2)            (the value residual, given v_first)
        a = σ(a0 + x^a a1 a2),   g = σ(x^g g1) g2
        κ̂ = normalize(k ⊙ k_k) per head,   k̃ = k ⊙ (1 + (a − 1) ⊙ k_a)
        o = generalized delta rule(r, w, k̃, v, κ̂, a)
        y = output((GroupNorm_H(o) + ((r ⊙ k̃ ⊙ r_k)·1) v) ⊙ g)   the bonus sum runs over each head

    x (B, T, C); v_first (B, T, C_v): the first layer's values, mixed in by every later layer (None:
    this is the first layer, or the residual is off); eps: the GroupNorm's ε (the authors' 64e-5);
    state (x_0 (B, C), the token before the first; S_0 (B, H, D_k, D_v)), None: zeros. Returns
    ((y (B, T, C), v (B, T, C_v) after the residual mix), (x_T, S_T)).
    """
    p = weights
    batch, length, dim = x.shape
    prev, S = (x.new_zeros(batch, dim), x.new_zeros(batch, heads, dim // heads, p["value.weight"].shape[0] // heads)) \
        if state is None else state
    per_head = lambda t: t.unflatten(-1, (heads, -1))  # noqa: E731  (B, C) -> (B, H, D)
    ys, vs = [], []
    for t in range(length):
        xt = x[:, t]
        shifted = {n: xt + (prev - xt) * p[f"x_{n}"] for n in "rwkvag"}
        prev = xt
        r = shifted["r"] @ p["receptance.weight"].T
        w = torch.exp(-math.exp(-0.5) * torch.sigmoid(p["w0"] + torch.tanh(shifted["w"] @ p["w1"]) @ p["w2"]))
        k = shifted["k"] @ p["key.weight"].T
        v = shifted["v"] @ p["value.weight"].T
        if v_first is not None:
            v = v + (v_first[:, t] - v) * torch.sigmoid(p["v0"] + shifted["v"] @ p["v1"] @ p["v2"])
        a = torch.sigmoid(p["a0"] + shifted["a"] @ p["a1"] @ p["a2"])
        g = torch.sigmoid(shifted["g"] @ p["g1"]) @ p["g2"]
        kappa = F.normalize(per_head(k * p["k_k"]), dim=-1)
        k = k * (1 + (a - 1) * p["k_a"])
        o, S = _wkv_step(S, per_head(r), per_head(w), per_head(k), per_head(v), kappa, per_head(a))
        mean, var = o.mean(-1, keepdim=True), o.var(-1, unbiased=False, keepdim=True)
        normed = ((o - mean) / torch.sqrt(var + eps)).flatten(1) * p["ln_x.weight"] + p["ln_x.bias"]
        bonus = (per_head(r) * per_head(k) * p["r_k"]).sum(-1, keepdim=True) * per_head(v)
        ys.append(((normed + bonus.flatten(1)) * g) @ p["output.weight"].T)
        vs.append(v)
    return (torch.stack(ys, dim=1), torch.stack(vs, dim=1)), (prev, S)


def rwkv7_channel_mix(x: Tensor, x_k: Tensor, key: Tensor, value: Tensor, *,
                      state: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The RWKV-7 channel mix (RWKV-LM's ``RWKV_CMix_x070``), one token at a time: a squared-ReLU
    feed-forward block over the token-shifted input, with no receptance gate (RWKV-4 to 6 had one).

        y_t = value(ReLU(key(x_t + (x_{t−1} − x_t) ⊙ x_k))²)

    x (B, T, C); x_k (C,); key (F, C); value (C, F); state x_0 (B, C), the token before the first
    (None: zeros). Returns (y (B, T, C), x_T).
    """
    prev = x.new_zeros(x.shape[0], x.shape[2]) if state is None else state
    ys = []
    for t in range(x.shape[1]):
        mixed = x[:, t] + (prev - x[:, t]) * x_k
        ys.append(torch.relu(mixed @ key.T).square() @ value.T)
        prev = x[:, t]
    return torch.stack(ys, dim=1), prev
