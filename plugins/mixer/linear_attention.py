"""Linear attention (Katharopoulos et al., 2020), with RetNet's per-head decay (Sun et al., 2023)
as an option, as a token mixer.

    y_t = φ(q_t) S_t / φ(q_t)·z_t,    S_t = γ S_{t−1} + φ(k_t)ᵀ v_t,    z_t = γ z_{t−1} + φ(k_t)

φ is elu + 1 (positive, so the normaliser z is too) or the identity (with q scaled by D^−½ as in
softmax attention, and no normaliser, as in RetNet). γ = 1 is plain causal linear attention; RetNet
gives head h the decay γ_h = 1 − 2^(−5−h). The state is S (D × D) and z (D) per head: fixed size.

This is Mamba-2's SSD with a decay that does not depend on the token (log γ per head), keys as B,
queries as C and values as x — so one chunked scan (``_ssd``) serves both; the normaliser rides
along as an extra value column of ones. Padded positions take a zero step and leave the state.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from seqzoo.errors import ConfigError
from seqzoo.interfaces import Mixer, MixerContext, MixerState
from seqzoo.nn.linear import Linear
from seqzoo.registry import builtin
from seqzoo.schema import PositiveInt

from ._segments import in_segments
from ._ssd import ssd_scan, ssd_step

FEATURE_MAPS = ("elu", "identity")


class LinearAttentionState(MixerState):
    """value (B, H, D_v [+ 1], D): S (and z, the last value column) per head, float32."""

    def __init__(self, value: Tensor) -> None:
        self.value = value

    def reorder(self, rows: Tensor) -> None:
        self.value = self.value.index_select(0, rows)


@builtin("linear attention, elu+1 or identity features, optional RetNet decay", aliases=("retention",))
class LinearAttention(Mixer):
    """heads: H (required). head_dim: D (null = dim / H). feature_map: elu (elu + 1) or identity.
    decay: null (γ = 1), retnet (γ_h = 1 − 2^(−5−h)) or a list of H values in (0, 1].
    normalize: divide by φ(q)·z (null = true for elu, false for identity). bias: on the q/k/v and
    output projections (false). chunk: the chunk length of the parallel form (64)."""

    causal_only = True
    residual_projections = ("out_proj",)
    example_params = {"heads": 2}

    def __init__(self, dim: int, heads: PositiveInt, head_dim: PositiveInt | None = None,
                 feature_map: str = "elu", decay: str | list[float] | None = None,
                 normalize: bool | None = None, bias: bool = False, chunk: PositiveInt = 64) -> None:
        super().__init__(dim)
        if feature_map not in FEATURE_MAPS:
            raise ConfigError(f"linear_attention feature_map {feature_map!r}: use one of {', '.join(FEATURE_MAPS)}")
        self.heads, self.head_dim = heads, head_dim or dim // heads
        self.feature_map, self.chunk = feature_map, chunk
        self.normalize = feature_map == "elu" if normalize is None else normalize
        if decay is None:
            gammas = [1.0] * heads
        elif decay == "retnet":
            gammas = [1 - 2.0 ** (-5 - h) for h in range(heads)]
        elif isinstance(decay, list) and len(decay) == heads and all(0 < g <= 1 for g in decay):
            gammas = [float(g) for g in decay]
        else:
            raise ConfigError(f"linear_attention decay {decay!r}: use null, retnet, or a list of {heads} "
                              f"values in (0, 1]")
        self.register_buffer("log_decay", torch.tensor([math.log(g) for g in gammas]), persistent=False)
        inner = self.heads * self.head_dim
        self.qkv_proj = Linear(dim, 3 * inner, bias=bias)
        self.stacked_rows = {"qkv_proj.weight": (inner, inner, inner)}
        self.out_proj = Linear(inner, dim, bias=bias)

    def new_state(self, batch: int, max_len: int, *, device: torch.device | None = None,
                  dtype: torch.dtype | None = None) -> LinearAttentionState:
        """Zero S and z per head; ``max_len`` plays no part."""
        dtype = torch.promote_types(dtype or self.qkv_proj.weight.dtype, torch.float32)
        width = self.head_dim + self.normalize
        return LinearAttentionState(torch.zeros(batch, self.heads, width, self.head_dim, device=device, dtype=dtype))

    def _phi(self, x: Tensor) -> Tensor:
        return F.elu(x) + 1 if self.feature_map == "elu" else x

    def forward(self, x: Tensor, context: MixerContext, state: LinearAttentionState | None = None) -> Tensor:
        """x (B, T, C) -> (B, T, C); continues from and updates ``state``. Without autograd, long
        sequences run in segments (``_segments``)."""
        segmented = in_segments(self, x, context, state)
        if segmented is not None:
            return segmented
        batch, length, _ = x.shape
        q, k, v = self.qkv_proj(x).unflatten(-1, (3, self.heads, self.head_dim)).unbind(2)  # (B, T, H, D)
        q, k = self._phi(q), self._phi(k)
        if self.feature_map == "identity":
            q = q * self.head_dim ** -0.5
        if self.normalize:  # z rides along as one more value column: its output is φ(q)·z
            v = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)
        steps = torch.ones(batch, length, self.heads, device=x.device, dtype=x.dtype)
        if context.padding is not None:
            steps = steps * context.padding.to(x.dtype)[..., None]  # 0: no decay, no input
        start = None if state is None else state.value
        if length == 1 and start is not None:
            y, final = ssd_step(v[:, 0], steps[:, 0], self.log_decay, k[:, 0], q[:, 0], start)
            y = y[:, None]
        else:
            y, final = ssd_scan(v, steps, self.log_decay, k, q, start, self.chunk)
        if state is not None:
            state.value = final
        if self.normalize:
            y = y[..., :-1] / (y[..., -1:] + 1e-6)  # + ε as the reference (fast-transformers)
        return self.out_proj(y.to(x.dtype).reshape(batch, length, -1))

    def extra_repr(self) -> str:
        return (f"heads={self.heads}, head_dim={self.head_dim}, feature_map={self.feature_map}, "
                f"normalize={self.normalize}")
