"""Griffin's Real-Gated Linear Recurrent Unit (De, Smith, Fernando et al., 2024, "Griffin: Mixing
Gated Linear Recurrences with Local Attention for Efficient Language Models"), token by token, as
RecurrentGemma runs it:

    log a_t = −c · r_t ⊙ softplus(Λ)                      a_t ∈ (0, 1] per channel
    h_t = a_t ⊙ h_{t−1} + √(1 − a_t²) ⊙ (i_t ⊙ x_t)

with r_t = σ(W_a x_t + b_a) the recurrence gate and i_t = σ(W_x x_t + b_x) the input gate, c = 8.
√(1 − a²) keeps h at the scale of its input whatever the decay. At the first token of a sequence
(RecurrentGemma's ``segment_pos == 0``, a "reset") the state starts afresh and the input is not
scaled: h_t = i_t ⊙ x_t.

Shape legend: B batch, T length, D channels (the LRU width). Written to be read, not to be fast:
one Python step per token.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def rg_lru(x: Tensor, input_gate: Tensor, recurrent_gate: Tensor, recurrent_param: Tensor, *, c: float = 8.0,
           reset: Tensor | None = None, state: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The RG-LRU over T tokens:

        a_t = exp(−c · r_t ⊙ softplus(Λ))
        h_t = a_t ⊙ h_{t−1} + √(1 − a_t²) ⊙ (i_t ⊙ x_t),    or h_t = i_t ⊙ x_t where reset_t

    x (B, T, D) the recurrence's input (the block's conv output); input_gate i and recurrent_gate r
    (B, T, D), each in (0, 1) (the sigmoids already taken); recurrent_param Λ (D,); c the decay's
    sharpness (8); reset (B, T) bool, True where a sequence starts (None: nowhere); state h_0 (B, D)
    (None: zeros). Returns (h_1..h_T (B, T, D), h_T (B, D)).
    """
    h = x.new_zeros(x.shape[0], x.shape[2]) if state is None else state
    reset = torch.zeros(x.shape[:2], dtype=torch.bool, device=x.device) if reset is None else reset
    hs = []
    for t in range(x.shape[1]):
        a = torch.exp(-c * recurrent_gate[:, t] * F.softplus(recurrent_param))   # (B, D)
        start = reset[:, t, None]
        scale = torch.where(start, torch.ones_like(a), torch.sqrt(1 - a ** 2))
        h = torch.where(start, torch.zeros_like(h), a * h) + scale * (input_gate[:, t] * x[:, t])
        hs.append(h)
    return torch.stack(hs, dim=1), h
