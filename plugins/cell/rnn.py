"""Elman RNN (Elman, 1990) in torch.nn.RNNCell's layout:

    h' = φ(W_ih x + b_ih + W_hh h + b_hh),   φ = tanh (default) or relu

``forward`` runs ``torch._VF.rnn_tanh`` / ``rnn_relu`` (nn.RNN's kernel) on the same parameters.
"""
from __future__ import annotations

from typing import Literal

from torch import _VF, Tensor

from seqzoo.errors import ConfigError
from seqzoo.registry import builtin

from ._fused import FusedCell


@builtin("Elman RNN, tanh or relu (torch.nn.RNNCell layout, fused nn.RNN kernel)")
class RNN(FusedCell):
    """nonlinearity: φ, tanh (default) or relu. bias: learn b_ih and b_hh (true).
    learn_initial_state: learn h0 instead of starting from zeros (false).

    State: h (B, H). Parameters: weight_ih (H, I), weight_hh (H, H), bias_ih, bias_hh (H,).
    """

    gates = 1

    def __init__(self, input_size: int, hidden_size: int, *,
                 nonlinearity: Literal["tanh", "relu"] = "tanh", bias: bool = True,
                 learn_initial_state: bool = False) -> None:
        if nonlinearity not in ("tanh", "relu"):
            raise ConfigError(f"cell rnn: nonlinearity={nonlinearity!r} must be 'tanh' or 'relu'")
        super().__init__(input_size, hidden_size, bias, learn_initial_state)
        self.nonlinearity = nonlinearity
        self.kernel = f"rnn_{nonlinearity}"

    def step(self, x_t: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """x_t (B, I), h (B, H) -> (h' (B, H), h')."""
        (h,) = self._parts(state, x_t.shape[0])
        cell = _VF.rnn_tanh_cell if self.nonlinearity == "tanh" else _VF.rnn_relu_cell
        h = cell(x_t, h, self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh)
        return h, h

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, nonlinearity={self.nonlinearity!r}"
