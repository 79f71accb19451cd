"""Kimi Delta Attention (Kimi Team, 2025, "Kimi Linear: An Expressive, Efficient Attention
Architecture") as a token mixer: the gated delta rule with a decay per key channel instead of per
head, in the layout of transformers' ``KimiLinearDeltaAttention``:

    q, k, v, f, b, r = in_proj(x)           q, k, v (H·D); f, r (R, the low rank); b (H)
    q, k, v = SiLU(causal depthwise conv1d([q | k | v]))     a separate short conv per channel
    q, k = L2norm(q) · D^−½, L2norm(k)       per head
    g_t = −exp(A_log) · softplus(f_b_proj(f_t) + dt_bias),  α_t = exp(g_t) ∈ (0, 1]^D,  β_t = σ(b_t)
    S_t = (I − β_t k_t k_tᵀ) Diag(α_t) S_{t−1} + β_t k_t v_tᵀ,    o_t = S_tᵀ q_t
    out = out_proj(RMSNorm(o) · w ⊙ σ(g_b_proj(r)))   the norm over each head, a sigmoid output gate

A_log is one rate per head, dt_bias one bias per (head, channel): each key channel of the state
forgets at its own, token-dependent rate (a fine-grained version of gated DeltaNet's scalar α_t).
The decoding state is the last K − 1 conv inputs and an (H, D, D) float32 state per row;
sequences run the chunked WY form of ``_delta_rule`` (fla's ``chunk_kda`` on CUDA when installed).
"""
from __future__ import annotations

from torch import Tensor, nn

from seqzoo.errors import ConfigError
from seqzoo.nn.linear import Linear
from seqzoo.registry import builtin
from seqzoo.schema import PositiveFloat, PositiveInt

from ._conv_state import RecurrentState, check_dt_range
from ._delta_rule import DeltaRuleMixer, decay_parameters, log_decay
from ._gated_norm import GatedRMSNorm


@builtin("Kimi Delta Attention: delta rule with a per-channel decay, low-rank gates; chunked WY form")
class KDA(DeltaRuleMixer):
    """Args (C = dim):
        heads: H (required).
        head_dim: D, the width of q, k and v per head (null = C / H).
        rank: R, the inner width of the low-rank decay and output-gate projections (null = D, as
            Kimi Linear).
        conv: K, the short conv's kernel over q, k and v (4).
        conv_bias: a bias in that conv (false).
        gate_bias: a bias in the output gate's second projection (false, as Kimi Linear; fla's
            layer has one).
        allow_neg_eigval: β = 2σ(b) ∈ (0, 2) (false, as Kimi Linear).
        norm_eps: ε of the per-head gated RMSNorm (1e-5, Kimi Linear's).
        dt_min, dt_max: the range of the initial softplus(dt_bias), log-uniform (0.001, 0.1).
        chunk: L, the chunk length of the parallel form (64); it only moves speed and memory.

    Parameters: in_proj C·(3·H·D + 2·R + H), conv1d 3·H·D·K, f_b_proj and g_b_proj R·H·D each,
    out_proj H·D·C, A_log (H), dt_bias (H·D), norm (D): ~4·C² at H·D = C."""

    example_params = {"heads": 2, "head_dim": 4, "rank": 3}

    def __init__(self, dim: int, heads: PositiveInt, head_dim: PositiveInt | None = None,
                 rank: PositiveInt | None = None, conv: PositiveInt = 4, conv_bias: bool = False,
                 gate_bias: bool = False, allow_neg_eigval: bool = False, norm_eps: PositiveFloat = 1e-5,
                 dt_min: PositiveFloat = 0.001, dt_max: PositiveFloat = 0.1, chunk: PositiveInt = 64) -> None:
        super().__init__(dim)
        check_dt_range("kda", dt_min, dt_max)
        if head_dim is None and dim % heads:
            raise ConfigError(f"kda: dim={dim} must be divisible by heads={heads}, or set head_dim")
        self.key_heads = self.heads = heads
        self.head_dim = self.value_head_dim = head_dim or dim // heads
        self.rank = rank or self.head_dim
        self.kernel, self.chunk, self.allow_neg_eigval = conv, chunk, allow_neg_eigval
        inner = heads * self.head_dim
        self.sizes = [3 * inner, self.rank, heads, self.rank]  # [q|k|v], f (decay), b (β), r (output gate)
        self.in_proj = Linear(dim, sum(self.sizes), bias=False)
        self.stacked_rows = {"in_proj.weight": (inner, inner, inner, *self.sizes[1:])}
        self.conv1d = nn.Conv1d(3 * inner, 3 * inner, conv, groups=3 * inner, bias=conv_bias)
        self.f_b_proj = Linear(self.rank, inner, bias=False)
        self.A_log, self.dt_bias = decay_parameters(heads, inner, dt_min, dt_max)
        self.g_b_proj = Linear(self.rank, inner, bias=gate_bias)
        self.norm = GatedRMSNorm(inner, heads, norm_eps, norm_before_gate=True, weight_per_group=True,
                                 activation="sigmoid")
        self.out_proj = Linear(inner, dim, bias=False)

    def inputs(self, x: Tensor, real: Tensor | None, state: RecurrentState | None) -> tuple[Tensor, ...]:
        """x (B, T, C) -> q, k, v (B, T, H, D), β (B, T, H), g (B, T, H, D), the gate (B, T, H·D)."""
        qkv, f, b, r = self.in_proj(x).split(self.sizes, dim=-1)
        q, k, v = self.qkv(qkv, real, state)
        f = self.f_b_proj(f).unflatten(-1, (self.heads, self.head_dim))
        g = log_decay(f, self.A_log[:, None], self.dt_bias.view(self.heads, self.head_dim))
        return q, k, v, self.beta(b), g, self.g_b_proj(r)

    def extra_repr(self) -> str:
        return f"heads={self.heads}, head_dim={self.head_dim}, rank={self.rank}, conv={self.kernel}"
