"""minGRU, the minimal gated recurrent unit (Feng, Tung, Ahmed, Bengio & Hajimirsadeghi, 2024,
"Were RNNs All We Needed?").

    z_t = σ(W_z x_t + b_z),   h̃_t = W_h x_t + b_h,   h_t = (1 − z_t) ⊙ h_{t−1} + z_t ⊙ h̃_t

Neither the gate nor the candidate reads h_{t−1}, which is what lets the paper train it with a
parallel scan. This plugin only writes ``step``; the default ``RecurrentCell.forward`` loops over
it (with ``lengths`` handled there), which is all the core needs.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from seqzoo.interfaces import RecurrentCell


class MinGRU(RecurrentCell):
    """bias: learn b_z and b_h (true).

    State: h (B, hidden_size). Parameters: ``proj`` (Linear input_size -> 2·hidden_size), rows
    [W_z; W_h].
    """

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True) -> None:
        super().__init__(input_size, hidden_size)
        self.proj = nn.Linear(input_size, 2 * hidden_size, bias=bias)

    def step(self, x_t: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """x_t (B, input_size), h (B, hidden_size) -> (h' (B, hidden_size), h')."""
        gate, candidate = self.proj(x_t).chunk(2, dim=-1)  # (B, hidden_size) each
        z = torch.sigmoid(gate)
        h = torch.lerp(state, candidate, z)  # (1 − z)·h + z·h̃
        return h, h
