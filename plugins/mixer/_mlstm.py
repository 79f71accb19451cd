"""The mLSTM in plain PyTorch, for the ``mlstm`` mixer (not a mixer of its own): the chunked form
for sequences, the one-token step for decoding, and flash-linear-attention's Triton kernels on CUDA
when ``fla`` has them.

    m_t = max(log f_t + m_{t−1}, i_t),    C_t = e^{log f_t + m_{t−1} − m_t} C_{t−1} + e^{i_t − m_t} k_t v_tᵀ
    n_t likewise with k_t,    h_t = C_tᵀ q_t / (max(|n_tᵀ q_t|, e^{−m_t}) + ε)          (per head)

``seqzoo.reference.mlstm`` is the same recurrence token by token. Within a chunk of L tokens, with
b_t = Σ_{s≤t} log f_s and (C_0, n_0, m_0) the state before it, the stabiliser unrolls to

    m_t = max(b_t + m_0, max_{s≤t} (b_t − b_s + i_s))

— the recurrence's own m_t, not a chunk-wise approximation of it (ε makes h depend on m by ε·e^{m};
transformers' chunkwise kernel computes the same m). The chunk's outputs and its write to the
state are then sums weighted by e^{b_t − b_s + i_s − m_t} ≤ 1 and e^{b_t + m_0 − m_t} ≤ 1: the
intra-chunk part is stabilised by its own row maximum for every chunk at once, and each chunk in
turn only rescales it by e^{max − m_t} once m_0 is known. Padded positions carry i = −∞ and
log f = 0: no write, no decay, m unchanged.

Shape legend: B batch, T length, H heads, D_k key width, D_v value width, N chunks of L tokens.
"""
from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F
from torch import Tensor

from ._chunks import in_chunks

State = tuple[Tensor, Tensor, Tensor]  # C (B, H, D_k, D_v), n (B, H, D_k), m (B, H)


def _finite(x: Tensor) -> Tensor:
    """x with −∞ (a row with nothing written: all its i = −∞) replaced by 0, to subtract safely."""
    return torch.where(torch.isfinite(x), x, torch.zeros_like(x))


def chunked(q: Tensor, k: Tensor, v: Tensor, i: Tensor, log_f: Tensor, state: State, chunk: int,
            eps: float) -> tuple[Tensor, State]:
    """The chunked form. q (scaled), k (B, T, H, D_k); v (B, T, H, D_v); i (B, T, H) (−∞: no
    write); log_f (B, T, H) ≤ 0; state (C, n, m) -> (h (B, T, H, D_v), final state)."""
    length = q.shape[1]
    q, k, v = (in_chunks(t, chunk).movedim(2, 3) for t in (q, k, v))             # (B, N, H, L, D)
    i = in_chunks(i, chunk, -torch.inf).movedim(2, 3)                            # (B, N, H, L)
    b = in_chunks(log_f, chunk).movedim(2, 3).cumsum(-1)                         # b_t, (B, N, H, L)
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    log_d = (b[..., :, None] - b[..., None, :] + i[..., None, :]).masked_fill(~causal, -torch.inf)
    inner = log_d.amax(-1)                                                       # max_{s≤t}, (B, N, H, L)
    scores = (q @ k.transpose(-1, -2)) * (log_d - _finite(inner)[..., None]).exp()
    inside, inside_n = scores @ v, scores.sum(-1)                                # per row, up to e^{inner}
    writes = b[..., -1:] - b + i                                                 # b_L − b_s + i_s
    top = writes.amax(-1)                                                        # (B, N, H)
    k_w = k * (writes - _finite(top)[..., None]).exp()[..., None]
    write_C, write_n = k_w.transpose(-1, -2) @ v, k_w.sum(-2)                    # up to e^{top}
    C, n, m = state
    outs = []
    # One unbind, not a slice per chunk (a slice's backward writes a zero gradient of the whole length).
    for q_n, b_n, inner_n, inside_c, inside_nc, top_n, write_C_n, write_n_n in zip(*(t.unbind(1) for t in (
            q, b, inner, inside, inside_n, top, write_C, write_n))):
        carried = b_n + m[..., None]                                             # b_t + m_0, (B, H, L)
        m_t = torch.maximum(carried, inner_n)
        old, new = (carried - m_t).exp(), (inner_n - m_t).exp()
        numerator = old[..., None] * (q_n @ C) + new[..., None] * inside_c
        denominator = old * (q_n @ n[..., None])[..., 0] + new * inside_nc
        outs.append(numerator / (torch.maximum(denominator.abs(), (-m_t).exp()) + eps)[..., None])
        m_end = torch.maximum(b_n[..., -1] + m, top_n)
        old, new = (b_n[..., -1] + m - m_end).exp(), (top_n - m_end).exp()
        C = old[..., None, None] * C + new[..., None, None] * write_C_n
        n = old[..., None] * n + new[..., None] * write_n_n
        m = m_end
    h = torch.stack(outs, 1).movedim(3, 2).flatten(1, 2)                       # (B, N·L, H, D_v)
    return h[:, :length], (C, n, m)


def step(q: Tensor, k: Tensor, v: Tensor, i: Tensor, log_f: Tensor, state: State, eps: float) -> tuple[Tensor, State]:
    """One token, for decoding: q (scaled), k (B, H, D_k); v (B, H, D_v); i, log_f (B, H) ->
    (h (B, H, D_v), new state)."""
    C, n, m = state
    m_new = torch.maximum(log_f + m, i)
    old, new = (log_f + m - m_new).exp(), (i - m_new).exp()
    C = old[..., None, None] * C + new[..., None, None] * k[..., None] * v[..., None, :]
    n = old[..., None] * n + new[..., None] * k
    denominator = torch.maximum((n * q).sum(-1).abs(), (-m_new).exp()) + eps
    return torch.einsum("bhkv,bhk->bhv", C, q) / denominator[..., None], (C, n, m_new)


@functools.cache
def _fla_kernels() -> tuple | None:
    """fla's (chunk_mlstm, fused_recurrent_mlstm), or None (fla absent, or older than its mLSTM)."""
    try:
        from fla.ops.mlstm import chunk_mlstm, fused_recurrent_mlstm
        return chunk_mlstm, fused_recurrent_mlstm
    except ImportError:
        return None


def mlstm(q: Tensor, k: Tensor, v: Tensor, i: Tensor, f: Tensor, state: State, chunk: int,
          eps: float) -> tuple[Tensor, State]:
    """The mLSTM over q, k (B, T, H, D_k) (q unscaled), v (B, T, H, D_v) and the gates'
    preactivations i, f (B, T, H) (i = −∞, f = +∞ at padded positions), from ``state`` (C, n, m),
    float32 -> (h (B, T, H, D_v), final state float32 or wider). On CUDA with fla's mLSTM kernels
    installed (and ``SEQZOO_SCAN`` not ``torch``), those (fused recurrent for a decode step without
    autograd; fla adds ε inside the max, max(|nᵀq|, e^{−m} + ε), a difference of at most ε·e^{m}
    in the denominator); else one step for a single token, the chunked form otherwise."""
    decode = q.shape[1] == 1
    scale = q.shape[-1] ** -0.5
    kernels = _fla_kernels() if q.is_cuda and os.environ.get("SEQZOO_SCAN") != "torch" else None
    if kernels is not None:
        kernel = kernels[1] if decode and not torch.is_grad_enabled() else kernels[0]  # fused_recurrent: no backward
        f = f.float().clamp(max=1e4)  # +∞ at padding made finite for the kernel: log σ(10⁴) is 0 all the same
        return kernel(q, k, v, i.float(), f, scale=scale, eps=eps, initial_state=state, output_final_state=True)
    dtype = torch.promote_types(q.dtype, torch.float32)
    with torch.autocast(q.device.type, enabled=False):  # the products stay in float32 under autocast too
        q, k, v, i = q.to(dtype) * scale, k.to(dtype), v.to(dtype), i.to(dtype)
        log_f = F.logsigmoid(f.to(dtype))
        state = tuple(t.to(dtype) for t in state)
        if decode:
            h, final = step(q[:, 0], k[:, 0], v[:, 0], i[:, 0], log_f[:, 0], state, eps)
            return h[:, None], final
        return chunked(q, k, v, i, log_f, state, chunk, eps)
