"""Gated DeltaNet (Yang, Kautz & Hatamizadeh, 2025, "Gated Delta Networks: Improving Mamba2 with
Delta Rule") as a token mixer: the linear-attention layer of Qwen3-Next, with its projections split
by kind as Qwen3.5 and OLMo-Hybrid store them (Qwen3-Next groups them by key head):

    q, k, v, z, b, a = in_proj(x)           q, k (G·D_k); v, z (H·D_v); b, a (H)
    q, k, v = SiLU(causal depthwise conv1d([q | k | v]))
    q, k = L2norm(q) · D_k^−½, L2norm(k)    per head
    g_t = −exp(A_log) · softplus(a_t + dt_bias),  α_t = exp(g_t),  β_t = σ(b_t)      one per value head
    S_t = α_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ,    o_t = S_tᵀ q_t
    out = out_proj(RMSNorm(o) · w ⊙ SiLU(z))   the norm over each value head, w shared by the heads

With ``gate: false`` it is DeltaNet (Yang et al., 2024): α = 1, no ``a`` rows, A_log or dt_bias.
There are more value heads than key heads when ``value_heads`` > ``heads`` (grouped value
attention: key head j serves value heads j·R … j·R + R − 1, R = H / G). The decoding state is the
last K − 1 conv inputs and an (H, D_k, D_v) float32 state per row; sequences run the chunked WY
form of ``_delta_rule`` (fla's ``chunk_gated_delta_rule`` on CUDA when installed).
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from seqzoo.errors import ConfigError
from seqzoo.nn.linear import Linear
from seqzoo.registry import builtin
from seqzoo.schema import PositiveFloat, PositiveInt

from ._conv_state import RecurrentState, check_dt_range
from ._delta_rule import DeltaRuleMixer, decay_parameters, log_decay
from ._gated_norm import GatedRMSNorm


@builtin("gated DeltaNet: delta rule, scalar decay per head, more value than key heads; chunked WY form")
class GatedDeltaNet(DeltaRuleMixer):
    """Args (C = dim):
        heads: G, the query/key heads (required).
        head_dim: D_k, each q/k head's width (null = C / G).
        value_heads: H, the value heads, a multiple of G (null = G).
        value_head_dim: D_v, each value head's width (null = D_k).
        conv: K, the short conv's kernel over [q | k | v] (4).
        conv_bias: a bias in that conv (false, as every reference).
        gate: the decay α_t (true); false is DeltaNet, α = 1.
        allow_neg_eigval: β = 2σ(b) ∈ (0, 2), so I − β k kᵀ can flip a direction (false; OLMo-Hybrid
            sets it; Grazzi et al., 2025).
        norm_eps: ε of the per-head gated RMSNorm (1e-6, Qwen3-Next's; fla and OLMo-Hybrid use 1e-5).
        dt_min, dt_max: the range of the initial softplus(dt_bias), log-uniform (0.001, 0.1).
        chunk: L, the chunk length of the parallel form (64); it only moves speed and memory.

    Parameters: in_proj C·(2·G·D_k + 2·H·D_v + 2·H), conv1d (2·G·D_k + H·D_v)·K, out_proj H·D_v·C,
    and A_log, dt_bias (H each), norm (D_v). With Qwen3-Next's shape (G·D_k = C, H·D_v = 2C) that
    is ~8·C² (fla's default, G·D_k = 0.75·C, H·D_v = 1.5·C with a separate gate, ~6·C²)."""

    example_params = {"heads": 2, "head_dim": 4, "value_heads": 4, "value_head_dim": 3}

    def __init__(self, dim: int, heads: PositiveInt, head_dim: PositiveInt | None = None,
                 value_heads: PositiveInt | None = None, value_head_dim: PositiveInt | None = None,
                 conv: PositiveInt = 4, conv_bias: bool = False, gate: bool = True, allow_neg_eigval: bool = False,
                 norm_eps: PositiveFloat = 1e-6, dt_min: PositiveFloat = 0.001, dt_max: PositiveFloat = 0.1,
                 chunk: PositiveInt = 64) -> None:
        super().__init__(dim)
        check_dt_range("gated_deltanet", dt_min, dt_max)
        if head_dim is None and dim % heads:
            raise ConfigError(f"gated_deltanet: dim={dim} must be divisible by heads={heads}, or set head_dim")
        value_heads = value_heads or heads
        if value_heads % heads:
            raise ConfigError(f"gated_deltanet: value_heads={value_heads} must be a multiple of heads={heads} "
                              f"(each key head serves value_heads / heads value heads)")
        self.key_heads, self.heads = heads, value_heads
        self.head_dim = head_dim or dim // heads
        self.value_head_dim = value_head_dim or self.head_dim
        self.kernel, self.chunk, self.gate, self.allow_neg_eigval = conv, chunk, gate, allow_neg_eigval
        keys, values = heads * self.head_dim, value_heads * self.value_head_dim
        self.sizes = [2 * keys + values, values, value_heads, value_heads if gate else 0]  # [q|k|v], z, b, a
        self.in_proj = Linear(dim, sum(self.sizes), bias=False)
        blocks = (keys, keys, values, values, value_heads, value_heads if gate else 0)  # q, k, v, z, b, a
        self.stacked_rows = {"in_proj.weight": tuple(rows for rows in blocks if rows)}
        self.conv1d = nn.Conv1d(self.sizes[0], self.sizes[0], conv, groups=self.sizes[0], bias=conv_bias)
        if gate:
            self.A_log, self.dt_bias = decay_parameters(value_heads, value_heads, dt_min, dt_max)
        else:
            self.no_weight_decay = ()  # DeltaNet has neither
        self.norm = GatedRMSNorm(values, value_heads, norm_eps, norm_before_gate=True, weight_per_group=True)
        self.out_proj = Linear(values, dim, bias=False)

    def inputs(self, x: Tensor, real: Tensor | None, state: RecurrentState | None) -> tuple[Tensor, ...]:
        """x (B, T, C) -> q, k (B, T, G, D_k), v (B, T, H, D_v), β, g (B, T, H) (g None without
        ``gate``), z (B, T, H·D_v)."""
        qkv, z, b, a = self.in_proj(x).split(self.sizes, dim=-1)
        q, k, v = self.qkv(qkv, real, state)
        g = log_decay(a, self.A_log, self.dt_bias) if self.gate else None
        return q, k, v, self.beta(b), g, z

    def extra_repr(self) -> str:
        return (f"heads={self.key_heads}, head_dim={self.head_dim}, value_heads={self.heads}, "
                f"value_head_dim={self.value_head_dim}, conv={self.kernel}, gate={self.gate}")


def qwen3_next_layout(heads: int, value_heads: int, head_dim: int, value_head_dim: int) -> Tensor:
    """The rows of Qwen3-Next's fused ``in_proj_qkvz`` and ``in_proj_ba`` (stacked in that order) that
    make this mixer's ``in_proj``: Qwen3-Next groups them by key head, [q_j k_j v_j z_j] and [b_j a_j]
    for j < G, this mixer by kind, [q | k | v | z | b | a]. Index (2·G·D_k + 2·H·D_v + 2·H,)."""
    per = value_heads // heads
    qkvz = torch.arange(heads * (2 * head_dim + 2 * per * value_head_dim)).view(heads, -1)
    ba = torch.arange(2 * value_heads).view(heads, -1) + qkvz.numel()
    parts = qkvz.split([head_dim, head_dim, per * value_head_dim, per * value_head_dim], -1) + ba.split(per, -1)
    return torch.cat([part.flatten() for part in parts])

