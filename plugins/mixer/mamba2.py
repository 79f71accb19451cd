"""Mamba-2 (Dao & Gu, 2024): the state-space dual layer as a token mixer.

    z, xBC, Δ = in_proj(h)                 z (E), xBC (E + 2·G·N), Δ (H); E = expand·C, H = E / P
    x, B, C = SiLU(causal depthwise conv1d(xBC))
    Δ = softplus(Δ + dt_bias)              one step size per head and token
    y = SSD(x, Δ, a, B, C) + D ⊙ x         a = −exp(A_log), a scalar per head; see ``_ssd``
    out = out_proj(RMSNorm_G(y ⊙ SiLU(z)))  gated RMSNorm over each of the G groups
                                           (or RMSNorm_G(y) ⊙ SiLU(z); or y ⊙ SiLU(z), no norm)

Heads are P wide; the G groups of heads share B and C (as grouped-query attention shares K and V).
The decoding state is the last K − 1 conv inputs and an (H, P, N) state per row.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqzoo.errors import ConfigError
from seqzoo.interfaces import Mixer, MixerContext
from seqzoo.nn.linear import Linear
from seqzoo.registry import builtin
from seqzoo.schema import NonNegativeFloat, PositiveFloat, PositiveInt

from ._conv_state import MambaState, causal_conv, check_dt_range
from ._gated_norm import GatedRMSNorm
from ._mimetic import mimic_linear_attention
from ._segments import in_segments
from ._ssd import ssd_scan, ssd_step


@builtin("Mamba-2 state-space dual: scalar decay per head, grouped B/C, chunked SSD")
class Mamba2(Mixer):
    """state: N (128). head_dim: P (64). groups: G, of heads sharing B and C (1). conv: K (4).
    expand: E / C (2). heads: H, for an E = H·P that is no multiple of C (Nemotron-H-4B: 112 heads
    of 64 over C = 3072); expand is then not used (null: H = expand·C / P). bias: on in_proj/out_proj
    (false). conv_bias (true). norm_eps: the gated RMSNorm's ε (1e-5). dt_min, dt_max: initial step
    range (0.001, 0.1). dt_limit: [lo, hi] clamp of Δ (null: none). chunk: the SSD chunk length (64).
    mimetic: start as linear attention does, with C's projection and conv channels copies of B's and
    almost no decay (``_mimetic``; Trockman et al., 2024) (false). rmsnorm: the gated RMSNorm before
    out_proj (true; false: out_proj(y ⊙ SiLU(z)), as Falcon-H1's ``mamba_rms_norm: false``).
    norm_before_gate: RMSNorm_G(y) ⊙ SiLU(z) instead (false; mamba_ssm's option of that name)."""

    causal_only = True
    residual_projections = ("out_proj",)  # A_log, D and the Δ bias are not linears: they keep their init
    no_weight_decay = ("A_log", "D")  # as the reference implementation: decay would pull A towards −1
    example_params = {"state": 8, "head_dim": 8, "groups": 2}  # heads that fit the kit's width

    def __init__(self, dim: int, state: PositiveInt = 128, head_dim: PositiveInt = 64, groups: PositiveInt = 1,
                 conv: PositiveInt = 4, expand: PositiveInt = 2, bias: bool = False, conv_bias: bool = True,
                 norm_eps: PositiveFloat = 1e-5, dt_min: PositiveFloat = 0.001, dt_max: PositiveFloat = 0.1,
                 dt_limit: tuple[NonNegativeFloat, PositiveFloat] | None = None, chunk: PositiveInt = 64,
                 mimetic: bool = False, heads: PositiveInt | None = None, rmsnorm: bool = True,
                 norm_before_gate: bool = False) -> None:
        super().__init__(dim)
        check_dt_range("mamba2", dt_min, dt_max)
        if dt_limit is not None and dt_limit[0] > dt_limit[1]:  # reversed, clamp() would make every Δ hi
            raise ConfigError(f"mamba2: dt_limit {list(dt_limit)} must be [low, high] with low ≤ high "
                              f"(null: no clamp)")
        inner = expand * dim if heads is None else heads * head_dim
        if inner % head_dim or (inner // head_dim) % groups:
            raise ConfigError(f"mamba2: the inner width {inner} must split into heads of head_dim={head_dim}, "
                              f"and their number into groups={groups}")
        self.inner, self.heads, self.head_dim, self.groups = inner, inner // head_dim, head_dim, groups
        self.state_size, self.kernel, self.chunk = state, conv, chunk
        self.dt_limit = tuple(dt_limit) if dt_limit is not None else None
        self.conv_dim = inner + 2 * groups * state
        self.in_proj = Linear(dim, inner + self.conv_dim + self.heads, bias=bias)
        self.stacked_rows = {"in_proj.weight": (inner, inner, groups * state, groups * state, self.heads)}
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, conv, groups=self.conv_dim, bias=conv_bias)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, self.heads + 1, dtype=torch.float32)))
        self.D = nn.Parameter(torch.ones(self.heads))
        dt = torch.exp(torch.rand(self.heads) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus⁻¹ of the initial Δ
        self.norm = GatedRMSNorm(inner, groups, norm_eps, norm_before_gate=norm_before_gate) if rmsnorm else None
        self.out_proj = Linear(inner, dim, bias=bias)
        if mimetic:
            width = groups * state
            b, c = 2 * inner, 2 * inner + width  # in_proj rows are z, x, B, C, Δ; conv channels x, B, C
            pairs = [(self.in_proj.weight[b:c], self.in_proj.weight[c:c + width]),
                     (self.conv1d.weight[inner:inner + width], self.conv1d.weight[inner + width:])]
            if bias:
                pairs.append((self.in_proj.bias[b:c], self.in_proj.bias[c:c + width]))
            if conv_bias:
                pairs.append((self.conv1d.bias[inner:inner + width], self.conv1d.bias[inner + width:]))
            mimic_linear_attention(self.A_log, *pairs)
            self.keep_init = ("in_proj.weight", "in_proj.bias")  # the copy must survive the model's init

    def new_state(self, batch: int, max_len: int, *, device: torch.device | None = None,
                  dtype: torch.dtype | None = None) -> MambaState:
        """Zero conv inputs (B, E + 2GN, K − 1) and a zero (B, H, P, N) state; no ``max_len``."""
        dtype = dtype or self.in_proj.weight.dtype
        return MambaState(torch.zeros(batch, self.conv_dim, self.kernel - 1, device=device, dtype=dtype),
                          torch.zeros(batch, self.heads, self.head_dim, self.state_size, device=device,
                                      dtype=torch.promote_types(dtype, torch.float32)))

    def forward(self, x: Tensor, context: MixerContext, state: MambaState | None = None) -> Tensor:
        """x (B, T, C) -> (B, T, C); continues from and updates ``state``. Without autograd, long
        sequences run in segments (``_segments``)."""
        segmented = in_segments(self, x, context, state)
        if segmented is not None:
            return segmented
        batch, length, _ = x.shape
        real = None if context.padding is None else context.padding.to(x.dtype)[..., None]  # (B, T, 1)
        z, xBC, dt = self.in_proj(x).split([self.inner, self.conv_dim, self.heads], dim=-1)
        if real is not None:
            xBC = xBC * real
        xBC = F.silu(causal_conv(self.conv1d, xBC, state))
        u, B, C = xBC.split([self.inner, self.groups * self.state_size, self.groups * self.state_size], dim=-1)
        dt = F.softplus(dt + self.dt_bias)  # (B, T, H)
        if self.dt_limit is not None:
            dt = dt.clamp(*self.dt_limit)
        if real is not None:
            dt = dt * real  # Δ = 0: the state neither decays nor takes input
        a = -torch.exp(self.A_log.float())
        u = u.unflatten(-1, (self.heads, self.head_dim))           # (B, T, H, P)
        B, C = (t.unflatten(-1, (self.groups, self.state_size)) for t in (B, C))
        start = None if state is None else state.ssm
        if length == 1 and start is not None:
            y, final = ssd_step(u[:, 0], dt[:, 0], a, B[:, 0], C[:, 0], start)
            y = y[:, None]
        else:
            y, final = ssd_scan(u, dt, a, B, C, start, self.chunk)
        if state is not None:
            state.ssm = final
        y = y.to(x.dtype) + u * self.D.to(x.dtype)[:, None]
        y = y.reshape(batch, length, self.inner)
        return self.out_proj(self.norm(y, z) if self.norm is not None else y * F.silu(z))

    def extra_repr(self) -> str:
        return (f"inner={self.inner}, heads={self.heads}, head_dim={self.head_dim}, groups={self.groups}, "
                f"state={self.state_size}, conv={self.kernel}")
