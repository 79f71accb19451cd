"""RWKV-7's generalised delta rule in plain PyTorch, for the ``rwkv7`` time mix, and the token shift
both RWKV-7 mixers read (not a mixer of its own): the chunked form for sequences, the one-token step
for decoding, flash-linear-attention's Triton kernels on CUDA when ``fla`` is installed.

The state is h = Sᵀ (D_k × D_v) per head, the transpose of the paper's S (fla's layout), and the
transition is diagonal plus rank one (DPLR):

    h_t = Diag(e^{w_t}) h_{t−1} + b_t (a_tᵀ h_{t−1}) + k_t v_tᵀ,    o_t = h_tᵀ r_t

with w ≤ 0 the log-decay and, for RWKV-7, a = −κ̂ (read what the state holds along the removal
key) and b = κ̂ ⊙ a_rate (write it back scaled by the in-context learning rate, so it is removed).
``seqzoo.reference.rwkv7.generalized_delta_rule`` is the same recurrence token by token.

The chunked form (the WY-style representation of fla's DPLR kernels, derived here): within a chunk
of L tokens, with Γ_t = Σ_{s≤t} w_s (per key channel, from the chunk's start), Γ⁻_t = Γ_t − w_t
and h_0 the state before it, the reads u_t = a_tᵀ h_{t−1} (rows of D_v) solve a unit lower
triangular system,

    u_t − Σ_{s<t} (ã_t · b̃_s) u_s = Σ_{s<t} (ã_t · k̃_s) v_s + ã_tᵀ h_0

with ã_t = a_t ⊙ e^{Γ⁻_t}, b̃_s = b_s ⊙ e^{−Γ_s}, k̃_s = k_s ⊙ e^{−Γ_s}, so U = U⁰ + W h_0 (one
triangular solve per chunk, every chunk at once), and

    o_t = Σ_{s≤t} (r̃_t · k̃_s) v_s + (r̃_t · b̃_s) u_s + r̃_tᵀ h_0,         r̃_t = r_t ⊙ e^{Γ_t}
    h_L = (Diag(e^{Γ_L}) + B̂ᵀ W) h_0 + K̂ᵀ V + B̂ᵀ U⁰,   K̂, B̂ rows k_s, b_s ⊙ e^{Γ_L − Γ_s}

All the (L × L) products run for every chunk at once; the Python loop over the T / L chunks only
carries h (two small products per chunk). The pairwise decay e^{Γ_t − Γ_s} of a channel is split
into e^{Γ_t} · e^{−Γ_s}, factors that depend on no later token (so a later token cannot move an
earlier output by a rounding), whose exponents stay within one chunk's decay: RWKV-7's w ≥ −e^{−½}
gives |Γ| ≤ 0.61·L (≈ 19 at L = 32: e^±19 is far inside float32's range, and its gradients are
too). A caller with steeper decays must take shorter chunks. Padded steps (w = 0, k = v = a = b =
0) leave the state as it was.

Shape legend: B batch, T length, H heads, D_k key width, D_v value width, N chunks of L tokens.
"""
from __future__ import annotations

import functools
import os

import torch
from torch import Tensor

from ._chunks import in_chunks
from ._conv_state import RecurrentState


def token_shift(x: Tensor, state: RecurrentState | None) -> Tensor:
    """x_{t−1} for every token of x (B, T, C): the state's ``shift`` (B, C) before the first one
    (zeros without a state, as the paper starts), which then becomes x's last token. Padded
    positions must be zero in x (the caller masks them): a zero is what an empty history holds."""
    before = x.new_zeros(x.shape[0], 1, x.shape[2]) if state is None else state.shift.to(x.dtype)[:, None]
    if state is not None:
        state.shift = x[:, -1].clone()  # not a view: it would keep the whole (B, T, C) input alive
    return torch.cat([before, x[:, :-1]], dim=1)


def dplr_chunked(r: Tensor, w: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor, state: Tensor | None,
                 chunk: int) -> tuple[Tensor, Tensor]:
    """The chunked form. r, w, k, a, b (B, T, H, D_k); v (B, T, H, D_v); state h_0 (B, H, D_k, D_v) or
    None -> (o (B, T, H, D_v), h_T), in float32 or wider."""
    dtype = torch.promote_types(v.dtype, torch.float32)
    length, value_width = v.shape[1], v.shape[-1]

    def blocks(x: Tensor) -> Tensor:  # (B, T, H, D) -> (B, H, N, L, D); zeros after the end are neutral
        return in_chunks(x.to(dtype), chunk).permute(0, 3, 1, 2, 4)

    r, w, k, v, a, b = (blocks(t) for t in (r, w, k, v, a, b))
    inclusive = w.cumsum(-2)                                            # Γ_t
    exclusive = inclusive - w                                           # Γ⁻_t = Γ_{t−1}
    a_in, r_in = a * exclusive.exp(), r * inclusive.exp()              # ã, r̃
    k_out, b_out = (t * (-inclusive).exp() for t in (k, b))             # k̃, b̃
    A_ab = (a_in @ b_out.mT).tril(-1)                                  # s < t: read before the write
    A_ak = (a_in @ k_out.mT).tril(-1)
    P_k, P_b = (r_in @ k_out.mT).tril(), (r_in @ b_out.mT).tril()     # s ≤ t
    rhs = torch.cat([A_ak @ v, a_in], -1)                               # [A_ak V | ã, which reads h_0]
    # (I − A_ab)⁻¹ rhs: solve_triangular reads the strict lower part and takes the diagonal as 1.
    U, W = torch.linalg.solve_triangular(-A_ab, rhs, upper=False, unitriangular=True).split(
        [value_width, a.shape[-1]], -1)                                 # U⁰ (.., L, D_v), W (.., L, D_k)
    inside = P_k @ v + P_b @ U                                          # what the chunk itself writes
    reads = r_in + P_b @ W                                              # o_t's rows over h_0
    to_end = (inclusive[..., -1:, :] - inclusive).exp()                 # e^{Γ_L − Γ_s}
    k_end, b_end = k * to_end, b * to_end
    carry = torch.diag_embed(inclusive[..., -1, :].exp()) + b_end.mT @ W  # h_L = carry h_0 + write
    write = k_end.mT @ v + b_end.mT @ U
    h = v.new_zeros(*v.shape[:2], a.shape[-1], value_width) if state is None else state.to(dtype)
    starts = []
    # One unbind, not a slice per chunk: the backward of x[:, :, n] writes a zero gradient of the
    # whole length for every chunk, an unbind's backward stacks once.
    for carry_n, write_n in zip(carry.unbind(2), write.unbind(2)):
        starts.append(h)
        h = carry_n @ h + write_n
    o = inside + reads @ torch.stack(starts, 2)                         # (B, H, N, L, D_v)
    return o.permute(0, 2, 3, 1, 4).flatten(1, 2)[:, :length], h


def dplr_step(r: Tensor, w: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
    """One token, for decoding: r, w, k, a, b (B, H, D_k); v (B, H, D_v); h (B, H, D_k, D_v) ->
    (o (B, H, D_v), new h), in h's dtype."""
    r, w, k, v, a, b = (t.to(h.dtype) for t in (r, w, k, v, a, b))
    read = torch.einsum("bhk,bhkv->bhv", a, h)
    h = w.exp()[..., None] * h + b[..., None] * read[..., None, :] + k[..., None] * v[..., None, :]
    return torch.einsum("bhk,bhkv->bhv", r, h), h


@functools.cache
def _fla_kernels() -> tuple | None:
    """fla's (chunk_rwkv7, fused_mul_recurrent_rwkv7), or None."""
    try:
        from fla.ops.rwkv7 import chunk_rwkv7, fused_mul_recurrent_rwkv7
    except ImportError:
        return None
    return chunk_rwkv7, fused_mul_recurrent_rwkv7


def wkv7(r: Tensor, w: Tensor, k: Tensor, v: Tensor, kappa: Tensor, rate: Tensor, state: Tensor | None,
         chunk: int) -> tuple[Tensor, Tensor]:
    """RWKV-7's recurrence: r, w (log-decay ≤ 0), k, kappa (κ̂, unit per head), rate (the in-context
    learning rate a) (B, T, H, D_k); v (B, T, H, D_v); state (B, H, D_k, D_v) float32 or None ->
    (o (B, T, H, D_v), final state float32 or wider). On CUDA with fla installed (and ``SEQZOO_SCAN``
    not ``torch``), fla's kernels, in the inputs' dtype as fla's own layer calls them; else one step
    for a single token with a state, the chunked form otherwise."""
    decode = r.shape[1] == 1 and state is not None
    kernels = _fla_kernels() if r.is_cuda and os.environ.get("SEQZOO_SCAN") != "torch" else None
    if kernels is not None:
        r, w, k, kappa, rate = (t.to(v.dtype) for t in (r, w, k, kappa, rate))
        if decode:
            return kernels[1](r, w, k, v, kappa, rate, scale=1.0, initial_state=state, output_final_state=True)
        return kernels[0](r, w, k, v, a=-kappa, b=kappa * rate, scale=1.0, initial_state=state,
                          output_final_state=True)
    dtype = torch.promote_types(v.dtype, torch.float32)
    # float32 under autocast too: the state's products and the triangular solve (which has no
    # bfloat16 kernel on the CPU) stay in float32, as every recurrent state in seqzoo does
    with torch.autocast(v.device.type, enabled=False):
        r, w, k, v, kappa, rate = (t.to(dtype) for t in (r, w, k, v, kappa, rate))
        a, b = -kappa, kappa * rate
        if decode:
            o, final = dplr_step(r[:, 0], w[:, 0], k[:, 0], v[:, 0], a[:, 0], b[:, 0], state)
            return o[:, None], final
        return dplr_chunked(r, w, k, v, a, b, state, chunk)
