"""No token mixer: a layer that is its feed-forward block alone (Nemotron-H, whose layers are each
a mixer alone or an FFN alone, NVIDIA 2025):

    y = x + FFN(n(x))

The block leaves out the mixer sublayer and its norms; this class only says so (``empty``) and
holds no state."""
from __future__ import annotations

import torch
from torch import Tensor

from seqzoo.interfaces import Mixer, MixerContext, MixerState
from seqzoo.registry import builtin


class NoState(MixerState):
    """Nothing to carry from token to token."""

    def reorder(self, rows: Tensor) -> None:
        pass


@builtin("no token mixer: the layer is its FFN alone (Nemotron-H's FFN-only layers)", aliases=("ffn_only",))
class NoMixer(Mixer):
    """No recipe parameters. A block whose mixer is ``none`` adds only its FFN to the residual
    stream; the layer must have an FFN, and its residual is sequential."""

    empty = True

    def new_state(self, batch: int, max_len: int, *, device: torch.device | None = None,
                  dtype: torch.dtype | None = None) -> NoState:
        return NoState()

    def forward(self, x: Tensor, context: MixerContext, state: MixerState | None = None) -> Tensor:
        """x (B, T, C) -> zeros (B, T, C): what a mixer that mixes nothing adds (a block skips it)."""
        return torch.zeros_like(x)
