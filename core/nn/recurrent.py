"""A stack of recurrent cells: layers, inter-layer dropout, bidirectional encoders, padded batches.

    stack = RecurrentStack(I, H, cell_factory("lstm"), layers=2, dropout=0.1, bidirectional=True)
    outputs, states = stack(x, state=None, lengths=None)
    # x (B, T, I) -> outputs (B, T, H·dirs); states[layer][direction] is that cell's final state

Each (layer, direction) is one cell, made by the ``cell(input_size, hidden_size)`` factory it is
given (``seqzoo.builder.Parts.factory("cell", spec)`` makes registered cells from a recipe spec); the cells'
fused kernels run the time loop, the stack only loops over layers and directions. Layer l > 0
reads layer l − 1's outputs (H·dirs wide) with dropout on them while training, as
torch.nn.LSTM's ``dropout``. The backward direction reads
each row reversed within its own length (row b's step t is x[b, len_b − 1 − t]), so padding never
reaches a real position and the result equals torch.nn.LSTM(bidirectional=True) on a packed batch.
Outputs are the directions concatenated, forward first; padded positions are zeros.

Parameters are ``cells.{l}.{d}.weight_ih`` etc. (d = 0 forward, 1 backward), which is torch's
``weight_ih_l{l}`` / ``weight_ih_l{l}_reverse``.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import ConfigError, InputError
from ..interfaces import RecurrentCell


class RecurrentStack(nn.Module):
    """cell: makes a cell, ``cell(input_size, hidden_size)``. layers: stacked layers
    (1). dropout: on each layer's outputs but the last, while training (0; no effect with one
    layer). bidirectional: a second cell per layer reads the sequence backwards (false).

    A state is a list with one entry per layer, each a list of per-direction cell states (a tensor
    or a tuple of tensors, each (B, H)); a unidirectional stack also takes a bare cell state per
    layer. ``forward`` always returns the nested form.
    """

    def __init__(self, input_size: int, hidden_size: int, cell: Callable[[int, int], RecurrentCell], layers: int = 1,
                 dropout: float = 0.0, bidirectional: bool = False) -> None:
        super().__init__()
        if layers < 1:
            raise ConfigError(f"recurrent stack: layers={layers} must be >= 1")
        if not 0.0 <= dropout < 1.0:
            raise ConfigError(f"recurrent stack: dropout={dropout} must be in [0, 1)")
        self.input_size, self.hidden_size = input_size, hidden_size
        self.num_layers, self.dropout = layers, dropout
        self.directions = 2 if bidirectional else 1
        width = hidden_size * self.directions
        self.cells = nn.ModuleList(
            nn.ModuleList(cell(input_size if layer == 0 else width, hidden_size)
                          for _ in range(self.directions))
            for layer in range(layers)
        )

    @property
    def bidirectional(self) -> bool:
        return self.directions == 2

    def forward(self, x: Tensor, state: list | None = None,
                lengths: Tensor | None = None) -> tuple[Tensor, list[list]]:
        """x (B, T, input_size), lengths (B,) int64 real lengths or None -> (outputs (B, T, H·dirs),
        final states [layer][direction])."""
        lengths = self.cells[0][0].check_input(x, lengths)
        state = self._check_state(state)
        reverse = None if self.directions == 1 else _reverse_index(x, lengths)  # (B, T)
        finals = []
        for layer, cells in enumerate(self.cells):
            if layer > 0:
                x = F.dropout(x, self.dropout, self.training)
            outputs, layer_states = [], []
            for direction, cell in enumerate(cells):
                start = None if state is None else state[layer][direction]
                inputs = x if direction == 0 else _gather_steps(x, reverse)
                out, final = cell(inputs, start, lengths)
                outputs.append(out if direction == 0 else _gather_steps(out, reverse))
                layer_states.append(final)
            x = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=-1)
            finals.append(layer_states)
        return x, finals

    def _check_state(self, state: list | None) -> list | None:
        if state is None:
            return None
        if not isinstance(state, (list, tuple)) or len(state) != self.num_layers:
            got = f"{len(state)} entries" if isinstance(state, (list, tuple)) else type(state).__name__
            raise InputError(f"recurrent stack: state must be a list of {self.num_layers} per-layer "
                             f"states, got {got}")
        nested = []
        for layer, entry in enumerate(state):
            if not isinstance(entry, list) and self.directions == 1:
                entry = [entry]  # a bare cell state: the one direction's
            if not isinstance(entry, list) or len(entry) != self.directions:
                raise InputError(f"recurrent stack: state[{layer}] must be a list of {self.directions} "
                                 f"per-direction cell states (forward, backward)")
            nested.append(entry)
        return nested

    @staticmethod
    def output(state) -> Tensor:
        """h of a cell state (B, H), or of one layer's per-direction list, the directions
        concatenated (B, H·dirs) as in the stack's outputs."""
        if isinstance(state, list):
            return torch.cat([RecurrentCell.output(s) for s in state], dim=-1)
        return RecurrentCell.output(state)

    @staticmethod
    def reorder_state(state, rows: Tensor):
        """Every tensor of a (nested) state with its batch rows picked by ``rows`` (beam search)."""
        if isinstance(state, Tensor):
            return state.index_select(0, rows.to(state.device))
        if isinstance(state, (list, tuple)):
            return type(state)(RecurrentStack.reorder_state(s, rows) for s in state)
        return state


def _reverse_index(x: Tensor, lengths: Tensor | None) -> Tensor:
    """(B, T) time index that reverses each row within its length and leaves padding in place.
    It is its own inverse, so the same gather puts the backward outputs back in order."""
    steps = torch.arange(x.shape[1], device=x.device).expand(x.shape[0], -1)
    if lengths is None:
        return steps.flip(1)
    last = lengths[:, None] - 1
    return torch.where(steps <= last, last - steps, steps)


def _gather_steps(x: Tensor, index: Tensor) -> Tensor:
    """x (B, T, C) with its steps picked per row by index (B, T) -> (B, T, C)."""
    return x.gather(1, index[..., None].expand(-1, -1, x.shape[-1]))
