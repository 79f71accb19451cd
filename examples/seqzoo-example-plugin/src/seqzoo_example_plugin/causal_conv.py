"""A causal depthwise convolution as a token mixer: the short convolution of H3 (Fu et al., 2023,
"Hungry Hungry Hippos"), Hyena (Poli et al., 2023) and Mamba (Gu & Dao, 2023), here on its own.

    u_{t,c} = Σ_{i=0}^{k−1} w_{c,i} · x_{t−i,c} + b_c     per channel c, kernel size k
    y_t     = W_o · act(u_t)                               act: SiLU or the identity

Each channel mixes only its own last k inputs (inputs before the first token count as zeros), so
the mixer sees k − 1 tokens back per layer and its decoding state is just those k − 1 inputs,
(B, k − 1, C), whatever the length. Whole sequences run as one ``F.conv1d`` with ``groups = C`` and
k − 1 zeros of left padding; decoding prepends the buffered inputs instead of the zeros.

Padding: padded inputs are zeroed before the convolution. For left padding (what batched
generation makes) a padded prefix is then exactly the convolution's own zero padding, so a padded
row gives the outputs and the state of the same row alone. Padded positions output zeros. (Padding
between real tokens would need the real tokens packed together first; seqzoo's generation only
ever pads on the left, and appends real tokens.)
"""
from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqzoo.interfaces import Mixer, MixerContext, MixerState
from seqzoo.nn.linear import Linear
from seqzoo.schema import PositiveInt


class ConvState(MixerState):
    """The last k − 1 inputs of one layer, (B, k − 1, C), oldest first (zeros before the first
    token)."""

    def __init__(self, buffer: Tensor) -> None:
        self.buffer = buffer

    def reorder(self, rows: Tensor) -> None:
        self.buffer = self.buffer.index_select(0, rows)


class CausalConv(Mixer):
    """Per-channel causal convolution over the last ``kernel`` tokens, then an output projection.

    kernel: k, how many tokens (the current one included) each output reads (4). activation:
    ``silu`` after the convolution, or ``none`` (silu). bias: a learned b_c per channel (true).

    Parameters: ``weight`` (C, 1, k), where ``weight[c, 0, k − 1 − i]`` is w_{c,i} (the last tap
    multiplies the current token, as in Mamba's ``conv1d``); ``bias`` (C,); ``out_proj`` (C -> C,
    no bias).
    """

    # Causal by construction: an encoder stack refuses it (it would see only the past).
    causal_only = True

    def __init__(self, dim: int, kernel: PositiveInt = 4, activation: Literal["silu", "none"] = "silu",
                 bias: bool = True) -> None:
        super().__init__(dim)
        self.kernel = kernel
        self.activation = activation
        self.weight = nn.Parameter(torch.empty(dim, 1, kernel))  # (C, 1, k), as nn.Conv1d's
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None
        nn.init.kaiming_uniform_(self.weight, a=5 ** 0.5)  # nn.Conv1d's default (fan_in = k)
        self.out_proj = Linear(dim, dim, bias=False)

    def new_state(self, batch: int, max_len: int, *, device: torch.device | None = None,
                  dtype: torch.dtype | None = None) -> ConvState:
        """k − 1 zero inputs per row: fixed size, ``max_len`` plays no part."""
        return ConvState(torch.zeros(batch, self.kernel - 1, self.dim,
                                     device=device if device is not None else self.weight.device,
                                     dtype=dtype if dtype is not None else self.weight.dtype))

    def forward(self, x: Tensor, context: MixerContext, state: ConvState | None = None) -> Tensor:
        """x (B, T, C) -> (B, T, C); continues from and updates ``state``."""
        real = context.padding.bool()[..., None] if context.padding is not None else None  # (B, T, 1)
        if real is not None:
            x = x.masked_fill(~real, 0.0)  # padded inputs become the convolution's zero padding
        past = self.kernel - 1
        if state is None:
            window = F.pad(x.transpose(1, 2), (past, 0))  # (B, C, k − 1 + T): zeros before token 0
        else:
            window = torch.cat([state.buffer.to(x.dtype), x], dim=1).transpose(1, 2)
            # The last k − 1 inputs (indexed from the start: a slice [-0:] would keep them all).
            state.buffer = window[:, :, window.shape[2] - past:].transpose(1, 2).to(state.buffer.dtype)
        u = F.conv1d(window, self.weight, self.bias, groups=self.dim).transpose(1, 2)  # (B, T, C)
        y = self.out_proj(F.silu(u) if self.activation == "silu" else u)
        return y.masked_fill(~real, 0.0) if real is not None else y
