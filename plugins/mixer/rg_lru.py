"""Griffin's recurrent block (De, Smith, Fernando et al., 2024, "Griffin: Mixing Gated Linear
Recurrences with Local Attention for Efficient Language Models"; the recurrent layers of Hawk,
Griffin and RecurrentGemma) as a token mixer:

    u, y = in_proj(x)                          each (B, T, W), W the LRU width
    u = causal depthwise conv1d_K(u)           kernel K = 4 over time, with a bias
    r_t = σ(W_a u_t + b_a),  i_t = σ(W_x u_t + b_x)      block-diagonal: H blocks of W / H
    log a_t = −c · r_t ⊙ softplus(Λ)           c = 8
    h_t = a_t ⊙ h_{t−1} + √(1 − a_t²) ⊙ (i_t ⊙ u_t)      the RG-LRU; at a sequence's first token
                                                          h_t = i_t ⊙ u_t (RecurrentGemma's reset)
    out = out_proj(h ⊙ GeLU(y))

The recurrence is diagonal (``_diagonal_scan``: its chunked form for sequences, one step for a
decode token, fla's HGRN kernels on CUDA). The decoding state is the conv's last K − 1 inputs, the
(W,) float32 state h and whether the row has begun, per row, whatever the length. Padded positions
enter the conv as zeros and take a = 1 and no input, so they leave the state as it was; a row's
first real token is its reset, wherever left padding puts it.
"""
from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqzoo.errors import ConfigError
from seqzoo.functional import upcast
from seqzoo.interfaces import Mixer, MixerContext
from seqzoo.nn.linear import Linear
from seqzoo.registry import builtin
from seqzoo.schema import PositiveFloat, PositiveInt

from ._conv_state import RecurrentState, causal_conv, conv_inputs
from ._diagonal_scan import diagonal_scan
from ._segments import in_segments

#: The largest gradient of √(1 − a²) (RecurrentGemma's ``_MAX_SQRT_GRADIENT``): where a → 1 the
#: square root's derivative grows without bound, and bfloat16 training would meet NaNs.
MAX_SQRT_GRADIENT = 1000.0


class _BoundedSqrt(torch.autograd.Function):
    """√x, with the gradient 1 / (2√x) capped at ``MAX_SQRT_GRADIENT`` (as RecurrentGemma)."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        ctx.save_for_backward(x)
        return x.sqrt()

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        return grad / (4 * x).clamp(min=MAX_SQRT_GRADIENT ** -2).sqrt()


def first_tokens(padding: Tensor | None, begun: Tensor | None, shape: torch.Size, device: torch.device) -> Tensor:
    """(B, T) True at each row's first real token, unless the row had begun before (``begun``
    (B,) bool, from the state): where the RG-LRU resets."""
    real = torch.ones(shape, dtype=torch.bool, device=device) if padding is None else padding.bool()
    first = real & (real.cumsum(1) == 1)
    return first if begun is None else first & ~begun[:, None]


@builtin("Griffin's RG-LRU recurrent block: conv, gated diagonal recurrence, GeLU branch; chunked scan")
class RGLRU(Mixer):
    """Args (C = dim):
        heads: H, the blocks of the block-diagonal gate weights (required; RecurrentGemma's
            ``num_attention_heads``).
        width: W, the LRU width (null = C; RecurrentGemma's ``lru_width``).
        conv: K, the temporal conv's kernel (4, RecurrentGemma's ``conv1d_width``).
        conv_bias: a bias in that conv (true, as RecurrentGemma).
        bias: biases on in_proj and out_proj (true, as RecurrentGemma).
        c: the decay's sharpness, log a = −c · r · softplus(Λ) (8, the paper's).
        approximate: the GeLU of the y branch, ``tanh`` (RecurrentGemma's gelu_pytorch_tanh) or ``none``.
        chunk: the longest chunk of the scan (64); it only moves speed and memory.

    Parameters: in_proj 2·C·W (+ 2·W), conv1d W·K (+ W), the gates 2·W²/H + 2·W, recurrent_param
    W, out_proj W·C (+ C): ~3·C² + 2·C²/H at W = C."""

    causal_only = True
    residual_projections = ("out_proj",)
    no_weight_decay = ("recurrent_param",)  # decay would pull Λ to 0: softplus(0) = 0.69, fast forgetting
    example_params = {"heads": 2}

    def __init__(self, dim: int, heads: PositiveInt, width: PositiveInt | None = None, conv: PositiveInt = 4,
                 conv_bias: bool = True, bias: bool = True, c: PositiveFloat = 8.0,
                 approximate: Literal["none", "tanh"] = "tanh", chunk: PositiveInt = 64) -> None:
        super().__init__(dim)
        self.width = width or dim
        if self.width % heads:
            raise ConfigError(f"rg_lru: width={self.width} must be divisible by heads={heads} "
                              f"(the gates are {heads} blocks of width / heads); change heads or width")
        self.heads, self.kernel, self.c, self.approximate, self.chunk = heads, conv, c, approximate, chunk
        block = self.width // heads
        self.in_proj = Linear(dim, 2 * self.width, bias=bias)  # rows [u | y]: RecurrentGemma's linear_x, linear_y
        self.conv1d = nn.Conv1d(self.width, self.width, conv, groups=self.width, bias=conv_bias)
        # RecurrentGemma's initialisation: gates N(0, 0.01 / (W / H)) with zero biases (σ = ½ to
        # start), the conv N(0, 0.01 / K), and Λ with exp(−softplus(Λ)) — a at c·r = 1 — in
        # [0.9, 0.999], its square uniform.
        std = math.sqrt(0.01 / block)
        for gate in ("input_gate", "recurrent_gate"):
            self.register_parameter(f"{gate}_weight", nn.Parameter(torch.randn(heads, block, block) * std))
            self.register_parameter(f"{gate}_bias", nn.Parameter(torch.zeros(heads, block)))
        radius = torch.empty(self.width).uniform_(0.9 ** 2, 0.999 ** 2).log().mul(-0.5)  # −log a, > 0
        self.recurrent_param = nn.Parameter(radius + torch.log(-torch.expm1(-radius)))  # softplus⁻¹
        with torch.no_grad():
            nn.init.normal_(self.conv1d.weight, std=math.sqrt(0.01 / conv))
            if self.conv1d.bias is not None:
                self.conv1d.bias.zero_()
        self.out_proj = Linear(self.width, dim, bias=bias)

    def new_state(self, batch: int, max_len: int, *, device: torch.device | None = None,
                  dtype: torch.dtype | None = None) -> RecurrentState:
        """Zero conv inputs ``conv`` (B, W, K − 1) in the model's dtype, a zero float32 state ``h``
        (B, W) and ``begun`` (B,) False; ``max_len`` plays no part."""
        dtype = dtype or self.out_proj.weight.dtype
        return RecurrentState(conv=conv_inputs(batch, self.width, self.kernel, device=device, dtype=dtype),
                              h=torch.zeros(batch, self.width, device=device,
                                            dtype=torch.promote_types(dtype, torch.float32)),
                              begun=torch.zeros(batch, dtype=torch.bool, device=device))

    def forward(self, x: Tensor, context: MixerContext, state: RecurrentState | None = None) -> Tensor:
        """x (B, T, C) -> (B, T, C); continues from and updates ``state``. Without autograd, long
        sequences run in segments (``_segments``)."""
        segmented = in_segments(self, x, context, state)
        if segmented is not None:
            return segmented
        u, y = self.in_proj(x).chunk(2, dim=-1)  # (B, T, W) each
        if context.padding is not None:
            u = u * context.padding.to(x.dtype)[..., None]
        u = causal_conv(self.conv1d, u, state)
        begun = None if state is None else state.begun
        first = first_tokens(context.padding, begun, x.shape[:2], x.device)
        with torch.autocast(x.device.type, enabled=False):  # gates and recurrence in float32 under autocast too
            g, b = self.recurrence_inputs(upcast(u), first)
            if context.padding is not None:  # a = 1 and no input: the state does not move
                real = context.padding.to(g.dtype)[..., None]
                g, b = g * real, b * real
            h, final = diagonal_scan(g, b, None if state is None else state.h, self.chunk)
        if state is not None:
            state.h = final
            state.begun = begun | (True if context.padding is None else context.padding.bool().any(1))
        return self.out_proj(h.to(x.dtype) * F.gelu(y, approximate=self.approximate))

    def recurrence_inputs(self, u: Tensor, first: Tensor) -> tuple[Tensor, Tensor]:
        """u (B, T, W) the conv's output, first (B, T) the resets -> the log-decay g = log a (≤ 0)
        and the input b = √(1 − a²) ⊙ i ⊙ u (i ⊙ u at a reset), each (B, T, W), in u's dtype."""
        weight = torch.cat([self.input_gate_weight, self.recurrent_gate_weight], -1).to(u.dtype)  # (H, W/H, 2W/H)
        bias = torch.cat([self.input_gate_bias, self.recurrent_gate_bias], -1).to(u.dtype)
        gates = torch.sigmoid(torch.einsum("bthi,hio->btho", u.unflatten(-1, (self.heads, -1)), weight) + bias)
        i, r = (t.flatten(2) for t in gates.chunk(2, dim=-1))  # (B, T, W) each
        g = -self.c * r * F.softplus(self.recurrent_param.to(u.dtype))
        scale = _BoundedSqrt.apply(-torch.expm1(2 * g))  # √(1 − a²), exact where a is near 1
        scale = torch.where(first[..., None], torch.ones_like(scale), scale)
        return g, scale * i * u

    def extra_repr(self) -> str:
        return f"heads={self.heads}, width={self.width}, conv={self.kernel}, c={self.c}"
