"""LFM2's gated short convolution (Liquid AI, 2025; the conv layers of LFM2, after Hyena's gated
convolutions, Poli et al., 2023) as a token mixer:

    B, C, x = in_proj(h)                       LFM2's names: two gates and an input, each C wide,
                                               from one fused projection of 3·C rows
    y = C ⊙ causal depthwise conv1d_K(B ⊙ x)   kernel K over time, per channel, zeros before the start
    out = out_proj(y)

No recurrence beyond the conv: a sequence is one conv over it (already parallel; there is nothing
to chunk), and the decoding state is the conv's last K − 1 gated inputs, (C, K − 1) per row
whatever the length. Padded positions enter the conv as zeros, as an empty history does, so they
leave the state as it was. ``seqzoo.reference.short_conv`` is the same layer token by token; on
CUDA with flash-linear-attention installed the conv runs on fla's ``causal_conv1d`` (``_conv_state``).
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from seqzoo.interfaces import Mixer, MixerContext
from seqzoo.nn.linear import Linear
from seqzoo.registry import builtin
from seqzoo.schema import PositiveInt

from ._conv_state import RecurrentState, causal_conv, conv_inputs
from ._segments import in_segments


@builtin("LFM2's gated short conv: B, C, x projections, causal depthwise conv of (B ⊙ x), gated by C")
class ShortConv(Mixer):
    """Args (C = dim):
        conv: K, the conv's kernel over time (3, LFM2's ``conv_L_cache``).
        conv_bias: a bias in the conv (false, as LFM2).
        bias: biases on in_proj and out_proj (false; LFM2 ties both to its ``conv_bias``).

    Parameters: in_proj 3·C² (+ 3·C), conv1d C·K (+ C), out_proj C² (+ C): ~4·C², as LFM2's."""

    causal_only = True
    residual_projections = ("out_proj",)

    def __init__(self, dim: int, conv: PositiveInt = 3, conv_bias: bool = False, bias: bool = False) -> None:
        super().__init__(dim)
        self.kernel = conv
        self.in_proj = Linear(dim, 3 * dim, bias=bias)  # rows [B | C | x], as LFM2's in_proj
        self.stacked_rows = {"in_proj.weight": (dim, dim, dim)}
        self.conv1d = nn.Conv1d(dim, dim, conv, groups=dim, bias=conv_bias)
        self.out_proj = Linear(dim, dim, bias=bias)

    def new_state(self, batch: int, max_len: int, *, device: torch.device | None = None,
                  dtype: torch.dtype | None = None) -> RecurrentState:
        """Zero conv inputs ``conv`` (B, C, K − 1) in the model's dtype; ``max_len`` plays no part."""
        return RecurrentState(conv=conv_inputs(batch, self.dim, self.kernel, device=device,
                                               dtype=dtype or self.out_proj.weight.dtype))

    def forward(self, x: Tensor, context: MixerContext, state: RecurrentState | None = None) -> Tensor:
        """x (B, T, C) -> (B, T, C); continues from and updates ``state``. Without autograd, long
        sequences run in segments (``_segments``)."""
        segmented = in_segments(self, x, context, state)
        if segmented is not None:
            return segmented
        b, c, u = self.in_proj(x).chunk(3, dim=-1)  # (B, T, C) each
        gated = b * u
        if context.padding is not None:
            gated = gated * context.padding.to(x.dtype)[..., None]
        return self.out_proj(c * causal_conv(self.conv1d, gated, state))

    def extra_repr(self) -> str:
        return f"conv={self.kernel}"
