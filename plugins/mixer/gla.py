"""Gated linear attention as a token mixer: GLA (Yang, Wang, Shen, Panda & Kim, 2024, "Gated Linear
Attention Transformers with Hardware-Efficient Training"), in the layout of fla's
``GatedLinearAttention``, and by its options MiniMax-01's lightning attention (MiniMax, 2025,
transformers' ``MiniMaxLightningAttention``):

    q, k, v, z, r = in_proj(x)              q, k (H·D_k); v, z (H·D_v); r (R, decay: channel)
    q, k, v ← φ(q), φ(k), φ(v)               φ = identity, or SiLU (lightning attention)
    g_t = logsigmoid(gk_proj(r_t)) / 16      decay: channel — one log-decay per key channel (GLA)
    g_t = −λ_h                               decay: head_fixed — one fixed rate per head (lightning)
    S_t = Diag(exp(g_t)) S_{t−1} + k_t v_tᵀ,    o_t = S_tᵀ q_t · s           per head
    out = out_proj(RMSNorm(o) · w ⊙ act(z))   act = SiLU (GLA) or σ (lightning); per head or whole

Lightning attention's rates are ALiBi's slopes scaled by the layer's depth: λ_h = 2^{−8(h+1)/H} ·
(1 − l / (L − 1) + 10⁻⁵) in layer l of L (``minimax_decay_scale``); a recipe gives each layer its
``decay_scale``. The decoding state is an (H, D_k, D_v) float32 state per row; sequences run the
chunked form of ``_gla`` (fla's ``chunk_gla`` / ``chunk_simple_gla`` on CUDA when installed).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from seqzoo.errors import ConfigError
from seqzoo.interfaces import Mixer, MixerContext
from seqzoo.nn.linear import Linear
from seqzoo.registry import builtin
from seqzoo.schema import NonNegativeFloat, PositiveFloat, PositiveInt

from ._conv_state import RecurrentState
from ._gated_norm import GatedRMSNorm
from ._gla import gated_linear_attention
from ._segments import in_segments

DECAYS = ("channel", "head_fixed")
FEATURE_MAPS = ("identity", "silu")
NORMS = ("head", "whole")
GATES = {"swish": "silu", "sigmoid": "sigmoid"}


def minimax_decay_scale(layer: int, layers: int) -> float:
    """MiniMax-01's depth factor of layer ``layer`` (0-based, counting every layer) of ``layers``:
    1 − l / (L − 1 + 10⁻⁵) + 10⁻⁵, from ~1 at the first layer to ~0 (almost no decay) at the last."""
    return 1 - layer / (layers - 1 + 1e-5) + 1e-5


def minimax_layout(heads: int, head_dim: int) -> Tensor:
    """The rows of MiniMax's fused ``qkv_proj`` that make the [q | k | v] rows of this mixer's
    ``in_proj``: MiniMax groups them by head, [q_h k_h v_h] for h < H, this mixer by kind.
    Index (3·H·D,)."""
    rows = torch.arange(3 * heads * head_dim).view(heads, 3, head_dim)
    return rows.transpose(0, 1).flatten()


@builtin("gated linear attention (GLA): per-channel decay from a low-rank gate, or MiniMax's fixed per-head decay")
class GLA(Mixer):
    """Args (C = dim):
        heads: H (required).
        head_dim: D_k, each q/k head's width (null = C / H; fla's GLA uses C / 2H, expand_k 0.5).
        value_head_dim: D_v, each value head's width (null = D_k).
        decay: channel — g_t = logsigmoid(gk_proj(r_t)) / gate_normalizer, one log-decay per key
            channel and token from a low-rank gate (GLA); head_fixed — one fixed rate per head,
            λ_h = 2^{−8(h+1)/H} · decay_scale (lightning attention) (channel).
        gate_rank: R, the low-rank gate's inner width (16, fla's gate_low_rank_dim; decay: channel).
        gate_normalizer: divides logsigmoid of the gate's logits (16, fla's gate_logit_normalizer).
        decay_scale: head_fixed's depth factor (1.0; MiniMax: ``minimax_decay_scale(l, L)``).
        feature_map: identity, or silu on q, k and v (MiniMax's SiLU over its fused qkv) (identity).
        scale: s, which multiplies q (null = D_k^−½; MiniMax: 1).
        norm: head — RMSNorm over each head's D_v, one weight shared by the heads (fla); whole —
            over all H·D_v at once, a weight per feature (MiniMax) (head).
        gate: the output gate after the norm, swish (fla) or sigmoid (MiniMax) (swish).
        norm_eps: ε of that RMSNorm (1e-5, fla's; MiniMax's is 1e-6).
        chunk: L, the chunk length of the parallel form (64); it only moves speed and memory.

    Parameters: in_proj C·(2·H·D_k + 2·H·D_v + R), gk_proj R·H·D_k + H·D_k (decay: channel only),
    out_proj H·D_v·C, norm D_v or H·D_v. fla's shape (D_k = C / 2H, D_v = C / H): ~4·C²."""

    causal_only = True
    residual_projections = ("out_proj",)
    example_params = {"heads": 2, "head_dim": 8, "value_head_dim": 6, "gate_rank": 4}

    def __init__(self, dim: int, heads: PositiveInt, head_dim: PositiveInt | None = None,
                 value_head_dim: PositiveInt | None = None, decay: str = "channel", gate_rank: PositiveInt = 16,
                 gate_normalizer: PositiveFloat = 16.0, decay_scale: NonNegativeFloat = 1.0,
                 feature_map: str = "identity", scale: PositiveFloat | None = None, norm: str = "head",
                 gate: str = "swish", norm_eps: PositiveFloat = 1e-5, chunk: PositiveInt = 64) -> None:
        super().__init__(dim)
        for name, value, allowed in (("decay", decay, DECAYS), ("feature_map", feature_map, FEATURE_MAPS),
                                     ("norm", norm, NORMS), ("gate", gate, tuple(GATES))):
            if value not in allowed:
                raise ConfigError(f"gla: {name}={value!r} is not one of {', '.join(allowed)}")
        if head_dim is None and dim % heads:
            raise ConfigError(f"gla: dim={dim} must be divisible by heads={heads}, or set head_dim")
        self.heads, self.head_dim = heads, head_dim or dim // heads
        self.value_head_dim = value_head_dim or self.head_dim
        self.decay, self.feature_map, self.chunk = decay, feature_map, chunk
        self.gate_normalizer, self.scale = gate_normalizer, self.head_dim ** -0.5 if scale is None else scale
        keys, values = heads * self.head_dim, heads * self.value_head_dim
        self.sizes = [keys, keys, values, values, gate_rank if decay == "channel" else 0]  # q, k, v, z, r
        self.in_proj = Linear(dim, sum(self.sizes), bias=False)
        self.stacked_rows = {"in_proj.weight": tuple(rows for rows in self.sizes if rows)}
        if decay == "channel":
            self.gk_proj = Linear(gate_rank, keys, bias=True)
        else:  # −λ_h, kept as numbers: a buffer would follow the model into bfloat16
            base = 1 / (2 ** (8 / heads))
            self.rates = [-(base ** (h + 1)) * decay_scale for h in range(heads)]
        self.norm = GatedRMSNorm(values, heads if norm == "head" else 1, norm_eps, norm_before_gate=True,
                                 weight_per_group=norm == "head", activation=GATES[gate])
        self.out_proj = Linear(values, dim, bias=False)

    def new_state(self, batch: int, max_len: int, *, device: torch.device | None = None,
                  dtype: torch.dtype | None = None) -> RecurrentState:
        """A zero float32 state S (B, H, D_k, D_v); ``max_len`` plays no part."""
        dtype = torch.promote_types(dtype or self.out_proj.weight.dtype, torch.float32)
        return RecurrentState(S=torch.zeros(batch, self.heads, self.head_dim, self.value_head_dim, device=device,
                                            dtype=dtype))

    def forward(self, x: Tensor, context: MixerContext, state: RecurrentState | None = None) -> Tensor:
        """x (B, T, C) -> (B, T, C); continues from and updates ``state``. Without autograd, long
        sequences run in segments (``_segments``)."""
        segmented = in_segments(self, x, context, state)
        if segmented is not None:
            return segmented
        q, k, v, z, r = self.in_proj(x).split(self.sizes, dim=-1)
        if self.feature_map == "silu":
            q, k, v = F.silu(q), F.silu(k), F.silu(v)
        q, k = (t.unflatten(-1, (self.heads, self.head_dim)) for t in (q, k))   # (B, T, H, D_k)
        v = v.unflatten(-1, (self.heads, self.value_head_dim))                   # (B, T, H, D_v)
        real = None if context.padding is None else context.padding.to(x.dtype)[..., None]  # (B, T, 1)
        if real is not None:
            v = v * real[..., None]  # no write at padded positions
        wide, steps = torch.promote_types(x.dtype, torch.float32), None  # decays in float32 even for bf16 x
        if self.decay == "channel":
            g = F.logsigmoid(self.gk_proj(r).to(wide)).unflatten(-1, (self.heads, self.head_dim)) / self.gate_normalizer
            log_decay = g if real is None else g * real[..., None]  # and no decay there
        else:
            log_decay = torch.tensor(self.rates, device=x.device, dtype=wide)
            steps = torch.ones(*x.shape[:2], 1, device=x.device, dtype=wide) if real is None else real.to(wide)
            steps = steps.expand(-1, -1, self.heads)
        o, final = gated_linear_attention(q, k, v, log_decay, None if state is None else state.S, self.chunk,
                                          self.scale, steps)
        if state is not None:
            state.S = final
        return self.out_proj(self.norm(o.to(x.dtype).flatten(2), z))

    def extra_repr(self) -> str:
        return (f"heads={self.heads}, head_dim={self.head_dim}, value_head_dim={self.value_head_dim}, "
                f"decay={self.decay}, feature_map={self.feature_map}, scale={self.scale:.4g}")

