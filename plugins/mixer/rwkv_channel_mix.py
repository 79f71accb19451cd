"""RWKV-7's channel mix (Peng, Zhang, Goldstein et al., 2025): a squared-ReLU feed-forward block over
the token-shifted input, with no receptance gate (RWKV-4 to 6 had one):

    y_t = down(ReLU(up(x_t + (x_{t−1} − x_t) ⊙ μ_k))²)

``receptance: true`` adds RWKV-4's gate (Peng et al., 2023), a sigmoid of the input shifted by a
mix of its own: y_t ← σ(receptance(x_t + (x_{t−1} − x_t) ⊙ μ_r)) ⊙ y_t.

It is a token mixer, not an ``ffn``: it reads the previous token, so it needs a decoding state
(the last token's input) and the padding of the tokens, which the FFN interface (``forward(x)``,
each position on its own) does not carry. An RWKV-7 block is then two layers, each a mixer alone
(``ffn: null``): x + rwkv7(LN(x)), then x + rwkv_channel_mix(LN(x)) (recipes/tiny-rwkv7.yaml).
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from seqzoo.interfaces import Mixer, MixerContext
from seqzoo.nn.linear import Linear
from seqzoo.registry import builtin
from seqzoo.schema import PositiveInt

from ._conv_state import RecurrentState
from ._rwkv import token_shift
from ._segments import in_segments


@builtin("RWKV-7 channel mix: token-shifted squared-ReLU feed-forward, in the mixer slot (it reads x_{t-1})")
class RWKVChannelMix(Mixer):
    """Args (C = dim):
        hidden: F, the inner width (null = 4·C rounded up to a multiple of 32, fla's default).
        receptance: gate the output by σ(receptance(x^r)), RWKV-4's channel mix (false: RWKV-7's).

    Parameters: x_k (C), up C·F, down F·C: 8·C² at F = 4·C; with the receptance, x_r (C) and
    receptance C² more."""

    causal_only = True
    residual_projections = ("down",)

    def __init__(self, dim: int, hidden: PositiveInt | None = None, receptance: bool = False) -> None:
        super().__init__(dim)
        self.hidden = hidden or -(-4 * dim // 32) * 32
        # The authors' start at a middle layer: 1 − (n / C)^(½)⁴ over the channels n.
        self.x_k = nn.Parameter(1.0 - (torch.arange(dim) / dim) ** (0.5 ** 4))
        self.up = Linear(dim, self.hidden, bias=False)
        self.down = Linear(self.hidden, dim, bias=False)
        # RWKV-4 starts μ_r as μ_k.
        self.x_r = nn.Parameter(self.x_k.detach().clone()) if receptance else None
        self.receptance = Linear(dim, dim, bias=False) if receptance else None

    def new_state(self, batch: int, max_len: int, *, device: torch.device | None = None,
                  dtype: torch.dtype | None = None) -> RecurrentState:
        """The last token's input ``shift`` (B, C), zeros; ``max_len`` plays no part."""
        return RecurrentState(shift=torch.zeros(batch, self.dim, device=device,
                                                dtype=dtype or self.up.weight.dtype))

    def forward(self, x: Tensor, context: MixerContext, state: RecurrentState | None = None) -> Tensor:
        """x (B, T, C) -> (B, T, C); continues from and updates ``state``. Without autograd, long
        sequences run in segments (``_segments``): the (B, T, F) activations stay a segment long."""
        segmented = in_segments(self, x, context, state)
        if segmented is not None:
            return segmented
        if context.padding is not None:  # the first real token's shift then reads an empty history
            x = x * context.padding.to(x.dtype)[..., None]
        prev = token_shift(x, state)
        y = self.down(torch.relu(self.up(torch.addcmul(x, prev - x, self.x_k))).square())
        if self.receptance is not None:
            y = torch.sigmoid(self.receptance(torch.addcmul(x, prev - x, self.x_r))) * y
        return y

    def extra_repr(self) -> str:
        return f"hidden={self.hidden}, receptance={self.receptance is not None}"
