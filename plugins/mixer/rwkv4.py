"""RWKV-4's time mix (Peng et al., 2023, "RWKV: Reinventing RNNs for the Transformer Era") as a
token mixer: keys, values and receptance from the token shifted against the one before it, and a
weighted average of the values seen so far per channel, each decayed by e^{w} per step, the current
token taking a bonus u instead (the WKV):

    x^□ = x_t ⊙ μ_□ + x_{t−1} ⊙ (1 − μ_□)                    token shift, □ ∈ k, v, r
    k, v, r = k_proj(x^k), v_proj(x^v), r_proj(x^r)
    wkv_t = (Σ_{s<t} e^{(t−1−s)w + k_s} v_s + e^{u+k_t} v_t) / (Σ_{s<t} e^{(t−1−s)w + k_s} + e^{u+k_t})
    out = out_proj(σ(r) ⊙ wkv),        w = −e^{time_decay},  u = time_first      (per channel)

The decoding state is the last token's input and, per channel, the WKV's numerator, denominator and
their scale (num, den, max) in float32, as transformers keeps them; sequences run ``_wkv4``'s
parallel scan (fla's ``fused_recurrent_rwkv4`` on CUDA when installed). An RWKV-4 block is two
layers, each a mixer alone: x + rwkv4(LN(x)), then x + rwkv_channel_mix(LN(x)) with its receptance
(recipes/tiny-rwkv4.yaml).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from seqzoo.errors import ConfigError
from seqzoo.interfaces import Mixer, MixerContext
from seqzoo.nn.linear import Linear
from seqzoo.registry import builtin
from seqzoo.schema import PositiveInt

from ._conv_state import RecurrentState
from ._rwkv import token_shift
from ._segments import in_segments
from ._wkv4 import EMPTY, wkv4


@builtin("RWKV-4 time mix: token shift, per-channel decay and a bonus for the current token (WKV); parallel scan")
class RWKV4(Mixer):
    """Args (C = dim):
        width: A, the width of k, v, r and the WKV (transformers' ``attention_hidden_size``; null = C).
        chunk: L, the chunk length of the parallel scan (32; a power of two); it only moves speed
            and memory.

    Parameters: k_proj, v_proj, r_proj C·A each, out_proj A·C, time_decay and time_first A each,
    time_mix 3C (the token-shift weights of the current token for k, v, r): 4·C·A + 2A + 3C."""

    causal_only = True
    residual_projections = ("out_proj",)
    no_weight_decay = ("time_mix",)  # per-channel weights stacked, not a matrix: the authors do not decay them

    def __init__(self, dim: int, width: PositiveInt | None = None, chunk: PositiveInt = 32) -> None:
        super().__init__(dim)
        if chunk & (chunk - 1):
            raise ConfigError(f"rwkv4: chunk={chunk} must be a power of two (the scan halves its chunks); "
                              f"use {1 << (chunk - 1).bit_length()}")
        self.width, self.chunk = width or dim, chunk
        self.k_proj, self.v_proj, self.r_proj = (Linear(dim, self.width, bias=False) for _ in range(3))
        self.out_proj = Linear(self.width, dim, bias=False)
        # The authors' starts (RWKV-4's RWKV_TimeMix) at a middle layer, their depth ratios at ½:
        # decays spread from e^{−5} to e^{3} per channel, a bonus log 0.3 with a zigzag, and the
        # token-shift weights rising over the channels.
        channel = torch.arange(self.width) / max(self.width - 1, 1)
        self.time_decay = nn.Parameter(-5 + 8 * channel ** (0.7 + 1.3 * 0.5))
        self.time_first = nn.Parameter(math.log(0.3) + ((torch.arange(self.width) + 1) % 3 - 1) * 0.5)
        ramp = torch.arange(dim) / dim
        self.time_mix = nn.Parameter(torch.stack([ramp ** 0.5, ramp ** 0.5 + 0.3 * 0.5, ramp ** 0.25]))  # k, v, r

    def new_state(self, batch: int, max_len: int, *, device: torch.device | None = None,
                  dtype: torch.dtype | None = None) -> RecurrentState:
        """The last token's input ``shift`` (B, C), zeros, and an empty WKV: ``num``, ``den`` zeros
        and ``max`` −1e38, (B, A) float32 each; ``max_len`` plays no part."""
        dtype = dtype or self.out_proj.weight.dtype
        wide = dict(device=device, dtype=torch.promote_types(dtype, torch.float32))
        return RecurrentState(shift=torch.zeros(batch, self.dim, device=device, dtype=dtype),
                              num=torch.zeros(batch, self.width, **wide), den=torch.zeros(batch, self.width, **wide),
                              max=torch.full((batch, self.width), EMPTY, **wide))

    def forward(self, x: Tensor, context: MixerContext, state: RecurrentState | None = None) -> Tensor:
        """x (B, T, C) -> (B, T, C); continues from and updates ``state``. Without autograd, long
        sequences run in segments (``_segments``)."""
        segmented = in_segments(self, x, context, state)
        if segmented is not None:
            return segmented
        real = None if context.padding is None else context.padding.to(x.dtype)[..., None]  # (B, T, 1)
        if real is not None:  # the first real token's shift then reads an empty history
            x = x * real
        prev = token_shift(x, state)
        # As transformers computes it (x·μ + x_{t−1}·(1 − μ)), so a copied layer gives its numbers.
        xk, xv, xr = (x[:, :, None] * self.time_mix + prev[:, :, None] * (1 - self.time_mix)).unbind(2)
        k, v, r = self.k_proj(xk), self.v_proj(xv), self.r_proj(xr)
        wkv, final = wkv4(self.time_decay, self.time_first, k, v,
                          None if state is None else (state.num, state.den, state.max), self.chunk, real)
        if state is not None:
            state.num, state.den, state.max = final
        return self.out_proj(torch.sigmoid(r) * wkv.to(r.dtype))

    def extra_repr(self) -> str:
        return f"width={self.width}, chunk={self.chunk}"
