"""RWKV-7 "Goose" (Peng, Zhang, Goldstein et al., 2025): the time-mix block as a token mixer, a
generalised delta rule whose state decays per key channel and forgets at a learned in-context
learning rate that depends on the token:

    x^□ = x_t + (x_{t−1} − x_t) ⊙ μ_□                       token shift, □ ∈ r, w, k, v, a, g
    r, k, v = r_proj(x^r), k_proj(x^k), v_proj(x^v);  v ← lerp(v, v_first, σ(v_lora(x^v)))
    w = exp(−e^{−½} σ(w_lora(x^w))),  a = σ(a_lora(x^a)),  g = g_lora(x^g)   low-rank MLPs
    κ̂ = normalize(k ⊙ k_k) per head,  k̃ = k ⊙ (1 + (a − 1) ⊙ k_a)
    S_t = S_{t−1} (Diag(w_t) − κ̂_t (a_t ⊙ κ̂_t)ᵀ) + v_t k̃_tᵀ,    o_t = S_t r_t    (per head)
    out = out_proj((GroupNorm_H(o) + ((r ⊙ k̃ ⊙ r_k)·1) v) ⊙ g)

The value residual: the first RWKV-7 layer of a forward hands its values v to the later ones
through ``context.shared`` (one context serves every layer of a forward), and each later layer
mixes them in. A layer that finds none is the first. The decoding state is the last token's
input and an (H, D_k, D_v) float32 state per row; sequences run the chunked DPLR form of
``_rwkv`` (fla's ``chunk_rwkv7`` on CUDA when installed).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqzoo.errors import ConfigError
from seqzoo.functional import upcast
from seqzoo.interfaces import Mixer, MixerContext
from seqzoo.nn.linear import Linear
from seqzoo.registry import builtin
from seqzoo.schema import PositiveFloat, PositiveInt

from . import _segments
from ._conv_state import RecurrentState
from ._rwkv import token_shift, wkv7

#: ``context.shared``: the first RWKV-7 layer's values (B, T, H·D_v) in this forward.
FIRST = "rwkv7.v_first"
#: ``context.shared`` inside ``in_segments``: the first layer's values cut per segment, or the list
#: the first layer's segments add theirs to.
SEGMENTS = "rwkv7.segments"
#: −e^{−½}: the lowest log-decay per step (the authors' soft clamp of w to (e^{−e^{−½}}, 1)).
LOG_DECAY_FLOOR = -math.exp(-0.5)


def low_rank(dim: int, rank: int, out: int, activation: nn.Module | None, bias: bool) -> nn.Sequential:
    """x -> up(act(down(x))): C -> R -> out, fla's ``LoRA`` (``.0`` down, ``.2`` up)."""
    return nn.Sequential(Linear(dim, rank, bias=False), activation or nn.Identity(), Linear(rank, out, bias=bias))


def fla_rank(dim: int, factor: float) -> int:
    """fla's default low-rank width: factor·√C rounded to a multiple of 32, at least 32."""
    return max(32, int(round(factor * dim ** 0.5 / 32) * 32))


@builtin("RWKV-7 time mix: generalised delta rule, per-channel decay, in-context learning rate; chunked DPLR")
class RWKV7(Mixer):
    """Args (C = dim; H = C / head_dim heads):
        head_dim: D_k, the key width per head (64).
        value_head_dim: D_v, the value width per head (null = D_k).
        decay_rank, a_rank, value_rank, gate_rank: the inner widths of the low-rank MLPs for w, a,
            the value residual and the gate g (null = fla's defaults: 2.5·√C·D_k/64, 2.5·√C·D_k/64,
            1.7·√C·D_k/64 and 5·√C, each rounded to a multiple of 32, at least 32).
        value_residual: mix the first RWKV-7 layer's values into this layer's (true, as RWKV-7);
            the first layer of a forward, and a layer alone, has none to mix.
        norm_eps: ε of the per-head GroupNorm of the output (null = 1e-5·D_k, the authors' 64e-5).
        chunk: L, the chunk length of the parallel form (32); it only moves speed and memory.

    Parameters (C_v = H·D_v): r_proj and k_proj C², v_proj C·C_v, out_proj C_v·C, the low-rank MLPs
    R_w·2C + R_a·2C + R_v·(C + C_v) + R_g·(C + C_v), x_mix 6C, k_k, k_a, r_k C each, g_norm 2C_v:
    ~4·C² + 4·R·C at C_v = C."""

    causal_only = True
    residual_projections = ("out_proj",)
    keep_init = ("w_lora.2.bias", "a_lora.2.bias", "v_lora.2.bias")  # the authors' per-channel starts
    no_weight_decay = ("x_mix", "r_k")  # matrices by shape, not weights: the authors do not decay them
    example_params = {"head_dim": 8, "decay_rank": 4, "a_rank": 4, "value_rank": 4, "gate_rank": 4}

    def __init__(self, dim: int, head_dim: PositiveInt = 64, value_head_dim: PositiveInt | None = None,
                 decay_rank: PositiveInt | None = None, a_rank: PositiveInt | None = None,
                 value_rank: PositiveInt | None = None, gate_rank: PositiveInt | None = None,
                 value_residual: bool = True, norm_eps: PositiveFloat | None = None,
                 chunk: PositiveInt = 32) -> None:
        super().__init__(dim)
        if dim % head_dim:
            raise ConfigError(f"rwkv7: dim={dim} must be divisible by head_dim={head_dim}; the keys are C wide, "
                              f"in heads of head_dim")
        self.heads, self.head_dim = dim // head_dim, head_dim
        self.value_head_dim = value_head_dim or head_dim
        self.value_residual, self.chunk = value_residual, chunk
        values, wide = self.heads * self.value_head_dim, head_dim / 64
        self.r_proj, self.k_proj = Linear(dim, dim, bias=False), Linear(dim, dim, bias=False)
        self.v_proj = Linear(dim, values, bias=False)
        self.w_lora = low_rank(dim, decay_rank or fla_rank(dim, 2.5 * wide), dim, nn.Tanh(), bias=True)
        self.a_lora = low_rank(dim, a_rank or fla_rank(dim, 2.5 * wide), dim, None, bias=True)
        if value_residual:
            self.v_lora = low_rank(dim, value_rank or fla_rank(dim, 1.7 * wide), values, None, bias=True)
        self.g_lora = low_rank(dim, gate_rank or fla_rank(dim, 5.0), values, nn.Sigmoid(), bias=False)
        self.g_norm = nn.GroupNorm(self.heads, values, eps=norm_eps or 1e-5 * head_dim)
        self.out_proj = Linear(values, dim, bias=False)
        # The authors' starts at a middle layer (their depth ratios at ½): a channel ramp n / C, and
        # a zigzag over each head that spreads the decays and rates across its channels.
        ramp = torch.arange(dim) / dim
        linear = torch.arange(dim) / max(dim - 1, 1) - 0.5
        zigzag = ((torch.arange(dim) % head_dim) - (head_dim - 1) / 2) / max((head_dim - 1) / 2, 1)
        zigzag = zigzag * zigzag.abs()
        powers = torch.tensor([0.2, 0.9, 0.7, 0.7, 0.9, 0.2])[:, None] * 0.5  # r, w, k, v, a, g
        self.x_mix = nn.Parameter(1.0 - ramp[None] ** powers)  # μ (6, C): r, w, k, v, a, g
        self.k_k = nn.Parameter(0.71 - linear * 0.1)
        self.k_a = nn.Parameter(torch.full((dim,), 1.02))
        self.r_k = nn.Parameter(torch.full((self.heads, head_dim), -0.04))
        with torch.no_grad():
            self.w_lora[2].bias.copy_(-6 + 6 * (torch.arange(dim) / max(dim - 1, 1)) ** (1 + 0.5 ** 0.3)
                                      + 0.5 + zigzag * 2.5)
            self.a_lora[2].bias.copy_(-0.19 + zigzag * 0.3 + linear * 0.4)
            if value_residual:
                self.v_lora[2].bias.copy_(0.73 - (torch.arange(values) / max(values - 1, 1) - 0.5) * 0.4)

    def new_state(self, batch: int, max_len: int, *, device: torch.device | None = None,
                  dtype: torch.dtype | None = None) -> RecurrentState:
        """The last token's input ``shift`` (B, C), zeros, and a zero float32 state S (B, H, D_k,
        D_v); ``max_len`` plays no part."""
        dtype = dtype or self.out_proj.weight.dtype
        return RecurrentState(shift=torch.zeros(batch, self.dim, device=device, dtype=dtype),
                              S=torch.zeros(batch, self.heads, self.head_dim, self.value_head_dim, device=device,
                                            dtype=torch.promote_types(dtype, torch.float32)))

    def forward(self, x: Tensor, context: MixerContext, state: RecurrentState | None = None) -> Tensor:
        """x (B, T, C) -> (B, T, C); continues from and updates ``state``. Without autograd, long
        sequences run in segments (``_segments``), each handed its share of the first layer's values."""
        pieces = context.shared.get(SEGMENTS)
        if pieces is None:  # called by the stack
            first = context.shared.get(FIRST) if self.value_residual else None
            if x.shape[1] > _segments.SEGMENT:
                cut = {"first": None if first is None else iter(first.split(_segments.SEGMENT, 1)), "own": []}
                segmented = _segments.in_segments(self, x, context.replace(shared={SEGMENTS: cut}), state)
                if segmented is not None:
                    if self.value_residual and first is None:
                        context.shared[FIRST] = torch.cat(cut["own"], 1)
                    return segmented
        else:  # one segment of a long sequence (in_segments calls them in order)
            first = None if pieces["first"] is None else next(pieces["first"])
        y, v = self.time_mix(x, context.padding, state, first)
        if self.value_residual and first is None:  # the first layer: the later ones mix these in
            if pieces is None:
                context.shared[FIRST] = v
            else:
                pieces["own"].append(v)
        return y

    def time_mix(self, x: Tensor, padding: Tensor | None, state: RecurrentState | None,
                 first: Tensor | None) -> tuple[Tensor, Tensor]:
        """x (B, T, C), padding (B, T) or None, first (B, T, C_v) the first layer's values or None ->
        (y (B, T, C), v (B, T, C_v), this layer's values after the residual mix)."""
        real = None if padding is None else padding.to(x.dtype)[..., None]  # (B, T, 1)
        if real is not None:
            x = x * real  # a zero input: the token shift of the first real token reads an empty history
        prev = token_shift(x, state)
        xr, xw, xk, xv, xa, xg = torch.addcmul(x[:, :, None], (prev - x)[:, :, None], self.x_mix).unbind(2)
        r, k, v = self.r_proj(xr), self.k_proj(xk), self.v_proj(xv)
        if self.value_residual:
            # The first layer mixes its values with themselves (no change): v_lora still takes part
            # in every forward, as DistributedDataParallel requires of every parameter.
            v = torch.lerp(v, v if first is None else first.to(v.dtype), torch.sigmoid(self.v_lora(xv)))
        w = LOG_DECAY_FLOOR * torch.sigmoid(upcast(self.w_lora(xw)))     # log-decay, (B, T, C) float32
        a = torch.sigmoid(upcast(self.a_lora(xa)))
        k = upcast(k)
        kappa = F.normalize((k * self.k_k).unflatten(-1, (self.heads, -1)), dim=-1)  # κ̂ (B, T, H, D_k)
        k = torch.addcmul(k, k * (a - 1), self.k_a)                      # k̃ = k ⊙ (1 + (a − 1) ⊙ k_a)
        if real is not None:  # w = 0, k̃ = κ̂ = v = 0 at padded positions: the state does not move
            w, k, kappa, v = w * real, k * real, kappa * real[..., None], v * real
        heads = lambda t: t.unflatten(-1, (self.heads, -1))  # noqa: E731  (B, T, H·D) -> (B, T, H, D)
        r, v = heads(r), heads(v)  # in x's dtype: fla's kernels take them so, the plain path widens them
        o, final = wkv7(r, heads(w), heads(k), v, kappa, heads(a), None if state is None else state.S, self.chunk)
        if state is not None:
            state.S = final
        o = F.group_norm(upcast(o).flatten(0, 1).flatten(1), self.heads, upcast(self.g_norm.weight),
                         upcast(self.g_norm.bias), self.g_norm.eps).view_as(o)
        bonus = (upcast(r) * heads(k) * self.r_k).sum(-1, keepdim=True) * upcast(v)  # (r ⊙ k̃ ⊙ r_k)·1 v
        y = ((o + bonus).flatten(2) * self.g_lora(xg)).to(x.dtype)
        return self.out_proj(y), v.flatten(2)

    def extra_repr(self) -> str:
        return (f"heads={self.heads}, head_dim={self.head_dim}, value_head_dim={self.value_head_dim}, "
                f"value_residual={self.value_residual}")
