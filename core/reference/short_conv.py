"""LFM2's gated short convolution (Liquid AI, 2025, the conv layers of LFM2), token by token:

    y_t = C_t ⊙ Σ_{k<K} w_k ⊙ (B ⊙ x)_{t−K+1+k}  (+ bias)

— the input gated by B, a causal depthwise convolution of width K over time (zeros before the
first token), the result gated by C. There is no recurrence beyond the conv's history: the state is
the last K − 1 gated inputs, (B, D, K − 1), oldest first (the order of ``torch.nn.Conv1d``'s taps).

Shape legend: B batch (also the input gate's name in LFM2; the context tells which), T length,
D channels, K the kernel width. Written to be read, not to be fast: one Python step per token.
"""
from __future__ import annotations

import torch
from torch import Tensor


def gated_short_conv(b: Tensor, c: Tensor, x: Tensor, weight: Tensor, bias: Tensor | None = None, *,
                     state: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The gated causal conv over T tokens:

        window_t = [the last K − 1 gated inputs | b_t ⊙ x_t]          (B, D, K)
        y_t = c_t ⊙ (Σ_k weight[:, k] ⊙ window_t[:, :, k] + bias)

    b, c, x (B, T, D); weight (D, K), tap k multiplying the input K − 1 − k tokens back (the
    layout of ``nn.Conv1d(D, D, K, groups=D).weight[:, 0]``); bias (D,) or None; state (B, D,
    K − 1) the gated inputs before the first token (None: zeros). Returns (y (B, T, D), the last
    K − 1 gated inputs). A token with b ⊙ x = 0 after a zero history leaves the history zero.
    """
    width = weight.shape[1]
    history = x.new_zeros(x.shape[0], x.shape[2], width - 1) if state is None else state
    ys = []
    for t in range(x.shape[1]):
        window = torch.cat([history, (b[:, t] * x[:, t])[..., None]], dim=-1)   # (B, D, K)
        conv = (window * weight).sum(-1) + (0 if bias is None else bias)
        ys.append(c[:, t] * conv)
        history = window[..., 1:]
    return torch.stack(ys, dim=1), history
