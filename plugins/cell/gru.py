"""Gated recurrent unit (Cho et al., 2014) in torch.nn.GRUCell's (= cuDNN's) form, gates stacked
r, z, n:

    r = σ(W_ir x + b_ir + W_hr h + b_hr),   z = σ(W_iz x + b_iz + W_hz h + b_hz)
    n = tanh(W_in x + b_in + r ⊙ (W_hn h + b_hn)),   h' = (1 − z) ⊙ n + z ⊙ h

The reset gate multiplies W_hn h + b_hn, after the matmul (arXiv v1, cuDNN, Keras
``reset_after=True``); Cho et al.'s published form resets h before it. ``forward`` runs
``torch._VF.gru`` (nn.GRU's kernel) on the same parameters.
"""
from __future__ import annotations

from torch import _VF, Tensor

from seqzoo.registry import builtin

from ._fused import FusedCell


@builtin("GRU, gates r,z,n, reset after W_hn h (torch.nn.GRUCell layout, fused nn.GRU kernel)")
class GRU(FusedCell):
    """bias: learn b_ih and b_hh (true; b_in and b_hn are not interchangeable). learn_initial_state:
    learn h0 instead of starting from zeros (false).

    State: h (B, H). Parameters: weight_ih (3H, I), weight_hh (3H, H), bias_ih, bias_hh (3H,).
    """

    gates = 3
    kernel = "gru"

    def __init__(self, input_size: int, hidden_size: int, *, bias: bool = True,
                 learn_initial_state: bool = False) -> None:
        super().__init__(input_size, hidden_size, bias, learn_initial_state)

    def step(self, x_t: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """x_t (B, I), h (B, H) -> (h' (B, H), h')."""
        (h,) = self._parts(state, x_t.shape[0])
        h = _VF.gru_cell(x_t, h, self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh)
        return h, h
