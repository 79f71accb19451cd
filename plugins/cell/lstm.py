"""Long short-term memory (Hochreiter & Schmidhuber, 1997; forget gate: Gers et al., 2000) in
torch.nn.LSTMCell's layout, gates stacked i, f, g, o:

    i, f, o = σ(W_i· x + b_i· + W_h· h + b_h·),   g = tanh(W_ig x + b_ig + W_hg h + b_hg)
    c' = f ⊙ c + i ⊙ g,   h' = o ⊙ tanh(c')

The cell state c carries gradients back through time multiplied only by f (the "constant error
carousel"), which is why LSTM gradients fade far slower than a vanilla RNN's. ``forward`` runs
``torch._VF.lstm`` (nn.LSTM's kernel) on the same parameters.
"""
from __future__ import annotations

from torch import _VF, Tensor

from seqzoo.registry import builtin

from ._fused import FusedCell


@builtin("LSTM, gates i,f,g,o (torch.nn.LSTMCell layout, fused nn.LSTM kernel)")
class LSTM(FusedCell):
    """bias: learn b_ih and b_hh (true; only their sum matters). learn_initial_state: learn h0 and
    c0 instead of starting from zeros (false).

    State: (h, c), each (B, H). Parameters: weight_ih (4H, I), weight_hh (4H, H), bias_ih, bias_hh
    (4H,). torch's init: no forget-gate bias of 1 (unlike Keras ``unit_forget_bias``).
    """

    gates = 4
    state_parts = 2
    kernel = "lstm"

    def __init__(self, input_size: int, hidden_size: int, *, bias: bool = True,
                 learn_initial_state: bool = False) -> None:
        super().__init__(input_size, hidden_size, bias, learn_initial_state)

    def step(self, x_t: Tensor, state: tuple[Tensor, Tensor]) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """x_t (B, I), (h, c) each (B, H) -> (h' (B, H), (h', c'))."""
        h, c = self._parts(state, x_t.shape[0])
        h, c = _VF.lstm_cell(x_t, (h, c), self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh)
        return h, (h, c)
