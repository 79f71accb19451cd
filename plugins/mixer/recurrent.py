"""A recurrent cell as a token mixer: any registered ``cell`` (rnn, lstm, gru, or a plugin's, such
as minGRU) run over the sequence inside a Transformer-shaped layer (Elman 1990; Hochreiter &
Schmidhuber 1997; Cho et al. 2014):

    h_t = cell(x_t, h_{t-1}),   y_t = W_o h_t   (W_o only when hidden ≠ C)

Its decoding state is the cell's state, of fixed size whatever the length. Whole sequences run the
cell's fused kernel; a padded batch is run packed, so padding never reaches the state.
"""
from __future__ import annotations

import torch
from torch import Tensor

from seqzoo.interfaces import Mixer, MixerContext, MixerState, RecurrentCell
from seqzoo.nn.linear import Linear
from seqzoo.registry import builtin
from seqzoo.schema import Size, Spec


class CellState(MixerState):
    """The cell's state (a tensor or a tuple of tensors, each (B, hidden)) after the tokens so far."""

    def __init__(self, value) -> None:
        self.value = value

    def reorder(self, rows: Tensor) -> None:
        self.value = (self.value.index_select(0, rows) if isinstance(self.value, Tensor)
                      else tuple(part.index_select(0, rows) for part in self.value))


@builtin("a recurrent cell (rnn, lstm, gru, plugins) run as a layer's token mixer", aliases=("rnn",))
class RecurrentMixer(Mixer):
    """cell: the recurrent cell (gru). hidden: its state width (null = dim); a projection back to
    dim follows when it differs."""

    causal_only = True
    residual_projections = ("out_proj",)  # when there is one (hidden ≠ C)
    example_params = {"cell": "gru"}

    def __init__(self, dim: int, cell: Spec["cell"] = "gru", hidden: Size | None = None) -> None:
        super().__init__(dim)
        self.hidden = hidden or dim
        self.cell: RecurrentCell = cell(dim, self.hidden)  # a factory of the recipe's cell
        self.out_proj = Linear(self.hidden, dim, bias=False) if self.hidden != dim else None

    def new_state(self, batch: int, max_len: int, *, device: torch.device | None = None,
                  dtype: torch.dtype | None = None) -> CellState:
        """The cell's initial state: fixed size, ``max_len`` plays no part."""
        return CellState(self.cell.initial_state(batch, device, dtype))

    def forward(self, x: Tensor, context: MixerContext, state: CellState | None = None) -> Tensor:
        """x (B, T, C) -> (B, T, C); continues from and updates ``state``."""
        start = state.value if state is not None else None
        if x.shape[1] == 1 and (context.padding is None or bool(context.padding.all())):
            out, final = self.cell.step(x[:, 0], start if start is not None
                                        else self.cell.initial_state(x.shape[0], x.device, x.dtype))
            out = out[:, None]
        elif context.padding is None:
            out, final = self.cell(x, start)
        else:
            out, final = self._padded(x, context.padding, start)
        if state is not None:
            state.value = final
        return self.out_proj(out) if self.out_proj is not None else out

    def _padded(self, x: Tensor, padding: Tensor, start) -> tuple[Tensor, object]:
        """Rows whose real tokens (``padding`` (B, T) = 1) are one contiguous run — left or right
        padded — are shifted to the front, run packed with their lengths, and shifted back, so
        padded positions give zeros and leave the state alone."""
        real = padding.bool()
        lengths = real.sum(-1)  # (B,)
        first = (real.long().cumsum(-1) == 0).sum(-1)  # (B,) leading padding of each row
        steps = torch.arange(x.shape[1], device=x.device)
        forward_index = (first[:, None] + steps).clamp(max=x.shape[1] - 1)  # (B, T)
        packed_in = x.gather(1, forward_index[..., None].expand_as(x))
        out, final = self.cell(packed_in, start, lengths)
        back_index = (steps - first[:, None]).clamp(min=0)
        out = out.gather(1, back_index[..., None].expand(-1, -1, out.shape[-1]))
        return out * real[..., None].to(out.dtype), final
