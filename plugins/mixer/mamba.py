"""Mamba (Gu & Dao, 2023): a selective state-space model as a layer's token mixer.

    x, z = in_proj(h)                          each (B, T, E), E = expand·C
    x = SiLU(causal depthwise conv1d(x))       kernel K over time, per channel
    Δ, B, C = x_proj(x)                        Δ of rank R, B and C of N features each
    Δ, B, C = rms(Δ), rms(B), rms(C)           only with bcdt_norm_eps: weightless (Falcon-Mamba) or
                                               with learned weights (bcdt_norm_weights, Jamba)
    Δ = softplus(dt_proj(Δ))                   (B, T, E), a step size per channel and token
    y = scan(x, Δ, A, B, C) + D ⊙ x            A = −exp(A_log) (E, N); see ``_selective_scan``
    out = out_proj(y ⊙ SiLU(z))

The decoding state is the last K − 1 conv inputs and the scan's (E, N) state per row: a fixed size,
whatever the length, and no random access to any single past token. A sequence runs the chunked
scan; a decode step runs the recurrence once. Padded positions feed zeros to the conv and take a
zero step (Δ = 0), so they leave both states as they were.
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

from ._conv_state import MambaState, causal_conv, check_dt_range
from ._mimetic import mimic_linear_attention
from ._segments import in_segments
from ._selective_scan import selective_scan, selective_step


@builtin("Mamba selective state space: conv, input-dependent Δ, B, C; chunked scan")
class Mamba(Mixer):
    """state: N, the state features per channel (16). conv: K, the conv kernel (4). expand: E / C (2).
    dt_rank: R (null = ⌈C / 16⌉). bias: biases on in_proj and out_proj (false). conv_bias (true).
    dt_min, dt_max: the range of the initial step sizes (0.001, 0.1), log-uniform as in the paper.
    chunk: the longest scan chunk (64); it only moves speed and memory. bcdt_norm_eps: ε of a weightless
    RMS norm of Δ (over its R features, before dt_proj), B and C (over their N) each, in float32 (null:
    none; Falcon-Mamba (Zuo et al., 2024) sets 1e-6 to keep them in scale). bcdt_norm_weights: give
    those norms learned weights, ``dt_norm`` (R), ``b_norm`` and ``c_norm`` (N) (false; Jamba, Lieber
    et al., 2024, has them). mimetic: start as linear attention does, with C's projection a copy of B's
    and almost no decay (``_mimetic``; Trockman et al., 2024) (false)."""

    causal_only = True
    # Δ's projection starts at U(±R^-1/2) and its bias at softplus⁻¹ of a log-uniform step, as in
    # mamba_ssm (whose ``_no_reinit`` keeps the bias); A_log and D are not linears and keep theirs.
    keep_init = ("dt_proj.weight", "dt_proj.bias")
    residual_projections = ("out_proj",)
    no_weight_decay = ("A_log", "D")  # as the reference implementation: decay would pull A towards −1

    def __init__(self, dim: int, state: PositiveInt = 16, conv: PositiveInt = 4, expand: PositiveInt = 2,
                 dt_rank: PositiveInt | None = None, bias: bool = False, conv_bias: bool = True,
                 dt_min: PositiveFloat = 0.001, dt_max: PositiveFloat = 0.1, chunk: PositiveInt = 64,
                 bcdt_norm_eps: PositiveFloat | None = None, bcdt_norm_weights: bool = False,
                 mimetic: bool = False) -> None:
        super().__init__(dim)
        check_dt_range("mamba", dt_min, dt_max)
        self.inner, self.state_size, self.kernel = expand * dim, state, conv
        self.dt_rank = dt_rank or math.ceil(dim / 16)
        self.chunk, self.bcdt_norm_eps = chunk, bcdt_norm_eps
        inner = self.inner
        self.in_proj = Linear(dim, 2 * inner, bias=bias)
        self.stacked_rows = {"in_proj.weight": (inner, inner), "x_proj.weight": (self.dt_rank, state, state)}
        self.conv1d = nn.Conv1d(inner, inner, conv, groups=inner, bias=conv_bias)
        self.x_proj = Linear(inner, self.dt_rank + 2 * state, bias=False)
        self.dt_proj = Linear(self.dt_rank, inner, bias=True)
        # S4D-real: A = −(1, 2, ..., N) in every channel, stored as its log so it stays negative.
        self.A_log = nn.Parameter(torch.log(torch.arange(1, state + 1, dtype=torch.float32)).repeat(inner, 1))
        self.D = nn.Parameter(torch.ones(inner))
        self.out_proj = Linear(inner, dim, bias=bias)
        if bcdt_norm_weights and bcdt_norm_eps is None:
            raise ConfigError("mamba: bcdt_norm_weights needs bcdt_norm_eps (the ε of those norms)")
        for name, size in (("dt_norm", self.dt_rank), ("b_norm", state), ("c_norm", state)):
            self.register_parameter(name, nn.Parameter(torch.ones(size)) if bcdt_norm_weights else None)
        with torch.no_grad():  # initial Δ = softplus(bias) log-uniform in [dt_min, dt_max]
            nn.init.uniform_(self.dt_proj.weight, -self.dt_rank ** -0.5, self.dt_rank ** -0.5)
            dt = torch.exp(torch.rand(inner) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
            self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus⁻¹
        if mimetic:
            rows = self.x_proj.weight  # (R + 2N, E): Δ's rows, then B's, then C's
            b_rows = rows[self.dt_rank:self.dt_rank + state]
            mimic_linear_attention(self.A_log, (b_rows, rows[self.dt_rank + state:]))
            self.keep_init = (*self.keep_init, "x_proj.weight")  # the copy must survive the model's init

    def new_state(self, batch: int, max_len: int, *, device: torch.device | None = None,
                  dtype: torch.dtype | None = None) -> MambaState:
        """Zero conv inputs and a zero scan state; ``max_len`` plays no part."""
        dtype = dtype or self.in_proj.weight.dtype
        return MambaState(torch.zeros(batch, self.inner, self.kernel - 1, device=device, dtype=dtype),
                          torch.zeros(batch, self.inner, self.state_size, device=device,
                                      dtype=torch.promote_types(dtype, torch.float32)))

    def forward(self, x: Tensor, context: MixerContext, state: MambaState | None = None) -> Tensor:
        """x (B, T, C) -> (B, T, C); continues from and updates ``state``. Without autograd, long
        sequences run in segments (``_segments``)."""
        segmented = in_segments(self, x, context, state)
        if segmented is not None:
            return segmented
        real = None if context.padding is None else context.padding.to(x.dtype)[..., None]  # (B, T, 1)
        u, z = self.in_proj(x).chunk(2, dim=-1)  # (B, T, E) each
        if real is not None:
            u = u * real
        u = F.silu(causal_conv(self.conv1d, u, state))
        dt, B, C = self.x_proj(u).split([self.dt_rank, self.state_size, self.state_size], dim=-1)
        if self.bcdt_norm_eps is not None:  # before the sequence/step split: both paths see it
            weights = [None if w is None else upcast(w) for w in (self.dt_norm, self.b_norm, self.c_norm)]
            dt, B, C = (F.rms_norm(upcast(t), t.shape[-1:], w, eps=self.bcdt_norm_eps).to(t.dtype)
                        for t, w in zip((dt, B, C), weights))
        dt = F.softplus(self.dt_proj(dt))  # (B, T, E)
        if real is not None:
            dt = dt * real  # Δ = 0: the state neither decays nor takes input
        A = -torch.exp(self.A_log.float())  # (E, N)
        start = None if state is None else state.ssm
        if x.shape[1] == 1 and start is not None:
            y, final = selective_step(u[:, 0], dt[:, 0], A, B[:, 0], C[:, 0], start)
            y = y[:, None]
        else:
            y, final = selective_scan(u, dt, A, B, C, start, self.chunk)
        if state is not None:
            state.ssm = final
        y = (y.to(x.dtype) + u * self.D.to(x.dtype)) * F.silu(z)
        return self.out_proj(y)

    def extra_repr(self) -> str:
        norm = "" if self.bcdt_norm_eps is None else f", bcdt_norm_eps={self.bcdt_norm_eps}"
        return f"inner={self.inner}, state={self.state_size}, conv={self.kernel}, dt_rank={self.dt_rank}{norm}"
