"""The mLSTM, token by token (Beck et al., 2024, "xLSTM: Extended Long Short-Term Memory"; the layer
of xLSTM-7B, Beck et al., 2025): a matrix memory per head with an exponential input gate, a sigmoid
forget gate, a normaliser state and a max-stabiliser m that keeps the exponentials finite:

    m_t = max(log f_t + m_{t−1}, ĩ_t),    f'_t = exp(log f_t + m_{t−1} − m_t),    i'_t = exp(ĩ_t − m_t)
    C_t = f'_t C_{t−1} + i'_t k_t v_tᵀ,    n_t = f'_t n_{t−1} + i'_t k_t
    h_t = C_tᵀ q_t s / (max(|n_tᵀ q_t s|, exp(−m_t)) + ε)

log f_t = logsigmoid(f̃_t), with ĩ_t, f̃_t the gates' preactivations. C and n are the paper's states
scaled by exp(−m_t): without ε, h_t = Cᵀq / max(|nᵀq|, 1) in the unscaled states whatever m is;
ε, added after the max as transformers' xLSTM does, makes m matter by ε·e^{m_t}, so m_0 = 0 (as
there) is part of the definition.

Shape legend: B batch, T length, H heads, D_k key width, D_v value width. Written to be read, not
to be fast: one Python step per token.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def mlstm(q: Tensor, k: Tensor, v: Tensor, i: Tensor, f: Tensor, *, scale: float | None = None,
          eps: float = 1e-6, state: tuple[Tensor, Tensor, Tensor] | None = None
          ) -> tuple[Tensor, tuple[Tensor, Tensor, Tensor]]:
    """The mLSTM recurrence over T tokens, as transformers' ``mlstm_recurrent_step_native``:

        m_t = max(logsigmoid(f_t) + m_{t−1}, i_t)
        C_t = exp(logsigmoid(f_t) + m_{t−1} − m_t) C_{t−1} + exp(i_t − m_t) k_t v_tᵀ    (n_t likewise, with k_t)
        h_t = C_tᵀ q_t s / (max(|n_tᵀ q_t s|, exp(−m_t)) + ε)

    q, k (B, T, H, D_k); v (B, T, H, D_v); i, f (B, T, H), the input and forget gates'
    preactivations. scale: s (None: D_k^−½). eps: ε (1e-6). state (C_0 (B, H, D_k, D_v), n_0 (B, H,
    D_k), m_0 (B, H)) (None: zeros). Returns (h (B, T, H, D_v), (C_T, n_T, m_T)). A token with
    i = −∞ and f = +∞ leaves the state as it was.
    """
    batch, length, heads, width = k.shape
    scale = width ** -0.5 if scale is None else scale
    if state is None:
        C = v.new_zeros(batch, heads, width, v.shape[-1])
        n, m = k.new_zeros(batch, heads, width), k.new_zeros(batch, heads)
    else:
        C, n, m = state
    outs = []
    for t in range(length):
        log_f = F.logsigmoid(f[:, t])                                           # (B, H)
        m_new = torch.maximum(log_f + m, i[:, t])
        forget, write = torch.exp(log_f + m - m_new), torch.exp(i[:, t] - m_new)
        C = forget[..., None, None] * C + write[..., None, None] * k[:, t, :, :, None] * v[:, t, :, None, :]
        n = forget[..., None] * n + write[..., None] * k[:, t]
        m = m_new
        query = q[:, t] * scale
        numerator = torch.einsum("bhkv,bhk->bhv", C, query)
        denominator = torch.maximum(torch.einsum("bhk,bhk->bh", n, query).abs(), torch.exp(-m)) + eps
        outs.append(numerator / denominator[..., None])
    return torch.stack(outs, dim=1), (C, n, m)
