"""What the built-in cells share: torch-layout parameters, the initial state, and a ``forward`` that
runs torch's fused whole-sequence kernel (``torch._VF.rnn_tanh | rnn_relu | lstm | gru``, cuDNN on
CUDA) on those same parameters, over a padded batch or, with ``lengths``, a packed one.

Parameters are named and laid out exactly as torch.nn.RNNCell / LSTMCell / GRUCell: ``weight_ih``
(G·H, I), ``weight_hh`` (G·H, H), ``bias_ih`` and ``bias_hh`` (G·H,), the G gates stacked along
dim 0, all initialised U(−1/√H, 1/√H) in torch's order (same seed, same weights), so
``load_state_dict`` moves weights between seqzoo and torch unchanged. A learned initial state adds
``h0`` (and, for the LSTM, ``c0``), each (H,), initialised to zeros.

On CUDA the four tensors are not one contiguous cuDNN buffer, so cuDNN copies them into one per
call (and torch warns once); the result is the same.
"""
from __future__ import annotations

import math

import torch
from torch import _VF, Tensor, nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from seqzoo.errors import ConfigError, InputError
from seqzoo.interfaces import RecurrentCell


class FusedCell(RecurrentCell):
    """One layer, one direction. Subclasses set ``gates`` (G), ``state_parts`` (1: h; 2: h, c),
    ``kernel`` (the ``torch._VF`` sequence function) and write ``step``."""

    own_init = True  # torch's U(−1/√H, 1/√H), not the model's N(0, std)
    gates: int = 1
    state_parts: int = 1
    kernel: str = "rnn_tanh"

    def __init__(self, input_size: int, hidden_size: int, bias: bool, learn_initial_state: bool) -> None:
        name = type(self).__name__
        if input_size < 1 or hidden_size < 1:
            raise ConfigError(f"{name}: input_size={input_size} and hidden_size={hidden_size} "
                              f"must both be >= 1")
        super().__init__(input_size, hidden_size)
        rows = self.gates * hidden_size
        self.weight_ih = nn.Parameter(torch.empty(rows, input_size))
        self.weight_hh = nn.Parameter(torch.empty(rows, hidden_size))
        for part in ("bias_ih", "bias_hh"):
            self.register_parameter(part, nn.Parameter(torch.empty(rows)) if bias else None)
        self.learn_initial_state = learn_initial_state
        if learn_initial_state:
            for part in self._initial_names():
                self.register_parameter(part, nn.Parameter(torch.empty(hidden_size)))
        self.reset_parameters()

    def _initial_names(self) -> tuple[str, ...]:
        return ("h0", "c0")[: self.state_parts]

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.hidden_size)
        for weight in self.flat_weights():
            nn.init.uniform_(weight, -bound, bound)
        if self.learn_initial_state:
            for part in self._initial_names():
                nn.init.zeros_(getattr(self, part))

    def flat_weights(self) -> list[Tensor]:
        """[weight_ih, weight_hh, bias_ih, bias_hh] (no biases when bias=false): a one-layer,
        one-direction weight list in the order torch's sequence kernels read it."""
        weights = [self.weight_ih, self.weight_hh]
        return weights + [self.bias_ih, self.bias_hh] if self.bias_ih is not None else weights

    def extra_repr(self) -> str:
        return (f"{self.input_size}, {self.hidden_size}, bias={self.bias_ih is not None}, "
                f"learn_initial_state={self.learn_initial_state}")

    # -- state ------------------------------------------------------------------------------------
    def initial_state(self, batch: int, device: torch.device | None = None,
                      dtype: torch.dtype | None = None):
        """Zeros, or the learned h0 (and c0) broadcast over the batch: each (B, H)."""
        device = self.weight_ih.device if device is None else device
        dtype = self.weight_ih.dtype if dtype is None else dtype
        if self.learn_initial_state:
            parts = [getattr(self, n).to(device, dtype).expand(batch, -1) for n in self._initial_names()]
        else:
            parts = [torch.zeros(batch, self.hidden_size, device=device, dtype=dtype)
                     for _ in range(self.state_parts)]
        return self._state(parts)

    def _state(self, parts) -> Tensor | tuple[Tensor, ...]:
        return parts[0] if self.state_parts == 1 else tuple(parts)

    def _parts(self, state, batch: int) -> tuple[Tensor, ...]:
        """A state as a tuple of its tensors, checked against the layout."""
        parts = (state,) if isinstance(state, Tensor) else tuple(state)
        shape = (batch, self.hidden_size)
        if len(parts) != self.state_parts or any(p.shape != shape for p in parts):
            want = "a tensor" if self.state_parts == 1 else f"a tuple of {self.state_parts} tensors"
            got = [tuple(p.shape) if isinstance(p, Tensor) else type(p).__name__ for p in parts]
            raise InputError(f"{type(self).__name__}: state must be {want} of shape (B, hidden_size)="
                             f"{shape}, got {got}")
        return parts

    # -- whole sequence ---------------------------------------------------------------------------
    def forward(self, x: Tensor, state=None, lengths: Tensor | None = None):
        """x (B, T, input_size) -> (h_all (B, T, H), final state), in one fused kernel call.

        ``lengths`` (B,) int64: real lengths. The batch is packed, so each row's final state is its
        state at its last real step and its outputs at padded positions are zeros.
        """
        lengths = self.check_input(x, lengths)
        batch, steps = x.shape[:2]
        start = self._parts(self.initial_state(batch, x.device, x.dtype) if state is None else state, batch)
        if lengths is None:
            out, final = self._run(x, start)
            return out, self._state(final)
        # pack_padded_sequence rejects empty rows: pack them as length 1, restore them below.
        packed = pack_padded_sequence(x, lengths.clamp(min=1).cpu(), batch_first=True, enforce_sorted=False)
        data, final = self._run(packed.data, [p.index_select(0, packed.sorted_indices) for p in start],
                                packed.batch_sizes)
        out, _ = pad_packed_sequence(
            PackedSequence(data, packed.batch_sizes, packed.sorted_indices, packed.unsorted_indices),
            batch_first=True, total_length=steps,
        )
        empty = lengths == 0
        out = out.masked_fill(empty[:, None, None], 0.0)
        final = [torch.where(empty[:, None], s, f.index_select(0, packed.unsorted_indices))
                 for s, f in zip(start, final)]
        return out, self._state(final)

    def _run(self, data: Tensor, start, batch_sizes: Tensor | None = None) -> tuple[Tensor, list[Tensor]]:
        """One layer, one direction of the ``torch._VF`` kernel: padded (B, T, I) batch-first, or
        packed (N, I) with ``batch_sizes``. -> (outputs, final state parts each (B, H))."""
        hx = [p.unsqueeze(0).contiguous() for p in start]  # (layers·directions = 1, B, H)
        hx = tuple(hx) if self.state_parts > 1 else hx[0]
        fn = getattr(_VF, self.kernel)
        weights, bias = self.flat_weights(), self.bias_ih is not None
        if batch_sizes is None:
            out, *final = fn(data, hx, weights, bias, 1, 0.0, self.training, False, True)
        else:
            out, *final = fn(data, batch_sizes, hx, weights, bias, 1, 0.0, self.training, False)
        return out, [f.squeeze(0) for f in final]
