"""Mamba-2's state-space dual (SSD; Dao & Gu, 2024) in plain PyTorch. One scalar decay per head
and token, so the scan is a masked matrix product inside each chunk:

    h_t = exp(Δ_t a) · h_{t−1} + Δ_t x_t ⊗ B_t,    y_t = h_t C_t                 (per head)

with x (B, T, H, P) split into G groups of R = H / G heads that share B_t, C_t (B, T, G, N), a (H,)
negative and a state h (B, H, P, N). Inside a chunk of L tokens, with S_t = a·Σ_{s≤t} Δ_s:

    y_t = Σ_{s≤t} (C_t·B_s) exp(S_t − S_s) Δ_s x_s   +   exp(S_t) · h_0 C_t       (diagonal + carry)
    h_L = Σ_s exp(S_L − S_s) Δ_s x_s ⊗ B_s   +   exp(S_L) · h_0

The first term is attention with a decaying causal mask — an (L × L) product per chunk, which is
where the matrix units do the work — and every exponent is a difference S_t − S_s ≤ 0, so nothing
overflows whatever the decay. Chunks follow one another in a Python loop over T / L.
"""
from __future__ import annotations

import torch
from torch import Tensor


def ssd_scan(x: Tensor, dt: Tensor, a: Tensor, B: Tensor, C: Tensor, h: Tensor | None = None,
             chunk: int = 64) -> tuple[Tensor, Tensor]:
    """-> (y (B, T, H, P), final state (B, H, P, N)). x (B, T, H, P); dt (B, T, H) ≥ 0 (0 leaves
    the state as it was: padding); a (H,) ≤ 0; B, C (B, T, G, N); h (B, H, P, N) or None (zeros).
    Computed in float32 or wider."""
    batch, length, heads, width = x.shape
    groups, size = B.shape[2], B.shape[3]
    dtype = torch.promote_types(x.dtype, torch.float32)
    x, dt, a, B, C = (t.to(dtype) for t in (x, dt, a, B, C))
    with torch.autocast(x.device.type, enabled=False):  # the products stay in float32 under autocast too
        # Heads as (group, head in group): B and C are shared within a group, never copied per head.
        x = x.unflatten(2, (groups, -1))                                   # (B, T, G, R, P)
        log_decay = (dt * a).unflatten(2, (groups, -1))                    # Δ_t a, (B, T, G, R)
        inputs = x * dt.unflatten(2, (groups, -1))[..., None]              # Δ_s x_s
        h = (x.new_zeros(batch, heads, width, size) if h is None else h.to(dtype)).unflatten(1, (groups, -1))
        outputs = []
        # One split, not a slice per chunk: the backward of x[:, a:b] writes a zero gradient of the
        # whole length T for every chunk (T²/L work), a split's backward concatenates once.
        pieces = zip(*(t.split(chunk, dim=1) for t in (log_decay, B, C, inputs)))
        for log_decay_c, Bc, Cc, xc in pieces:
            S = log_decay_c.cumsum(1)                                      # (B, L, G, R)
            L = S.shape[1]
            # exp(S_t − S_s) for s ≤ t, 0 above the diagonal (masked before exp: S_t − S_s > 0 there).
            gaps = (S[:, :, None] - S[:, None]).permute(0, 3, 4, 1, 2)    # (B, G, R, L_t, L_s)
            causal = torch.ones(L, L, dtype=torch.bool, device=x.device).tril()
            decay = gaps.masked_fill(~causal, float("-inf")).exp()
            scores = torch.einsum("btgn,bsgn->bgts", Cc, Bc)[:, :, None] * decay   # (B, G, R, L, L)
            diagonal = torch.einsum("bgrts,bsgrp->btgrp", scores, xc)
            carry = torch.einsum("btgn,bgrpn->btgrp", Cc, h) * S.exp()[..., None]
            outputs.append(diagonal + carry)
            to_end = (S[:, -1:] - S).exp()                                 # exp(S_L − S_s), (B, L, G, R)
            h = S[:, -1].exp()[..., None, None] * h + torch.einsum("bsgn,bsgr,bsgrp->bgrpn", Bc, to_end, xc)
    y = torch.cat(outputs, 1).flatten(2, 3)                            # (B, T, H, P)
    return y, h.flatten(1, 2)


def ssd_step(x: Tensor, dt: Tensor, a: Tensor, B: Tensor, C: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
    """One token, for decoding: x (B, H, P); dt (B, H); B, C (B, G, N); h (B, H, P, N) ->
    (y (B, H, P), new h)."""
    dtype = h.dtype
    x, dt, a, B, C = (t.to(dtype) for t in (x, dt, a, B, C))
    groups = B.shape[1]
    Bh = B.repeat_interleave(x.shape[1] // groups, dim=1)               # (B, H, N)
    Ch = C.repeat_interleave(x.shape[1] // groups, dim=1)
    h = torch.exp(dt * a)[..., None, None] * h + (dt[..., None] * x)[..., None] * Bh[:, :, None]
    return torch.einsum("bhpn,bhn->bhp", h, Ch), h
