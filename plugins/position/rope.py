"""Rotary position embedding (Su et al., 2021, RoFormer).

    x'_a = x_a cos θ − x_b sin θ,    x'_b = x_a sin θ + x_b cos θ,    θ = p·ω_k,    ω_k = base^(−2k/d_r)

Pair k, dims (a, b), of each q/k head rotates by θ at position p. Pairs are (k, k + d_r/2) in the default
rotate-half layout (GPT-NeoX, HF LLaMA) or (2k, 2k+1) with ``interleaved: true`` (Meta LLaMA, GPT-J).
Angles are formed in float64 and cos/sin kept in float32 whatever the model dtype (bf16 cannot hold positions
above 256 exactly). Only the first ``rotary_dim`` dims of each head rotate (partial rotary).
"""
from __future__ import annotations

import torch
from torch import Tensor

from seqzoo.errors import ConfigError
from seqzoo.functional import upcast
from seqzoo.interfaces import PositionScheme, Rotary
from seqzoo.registry import builtin
from seqzoo.schema import PositiveFloat, PositiveInt, Spec


def rope_inv_freq(rotary_dim: int, base: float | Tensor, device: torch.device | None = None,
                  dtype: torch.dtype = torch.float64) -> Tensor:
    """ω_k = base^(−2k/d_r) for k = 0..d_r/2−1 (HF ``inv_freq``), in float64 by default: at
    position 10⁶ the float32 rounding of ω alone moves the angle by ~0.06 rad."""
    exponents = torch.arange(0, rotary_dim, 2, device=device, dtype=dtype) / rotary_dim
    return 1.0 / (base ** exponents)


def rotate(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor:
    """Rotate the first 2·cos.shape[-1] dims of x (B, H, T, D) by per-pair angles; cos/sin
    (B|1, 1, T, d_r/2) float32. The rest of each head passes through."""
    half = cos.shape[-1]
    rot, rest = upcast(x[..., : 2 * half]), x[..., 2 * half:]
    if interleaved:
        a, b = rot[..., 0::2], rot[..., 1::2]
        out = torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)
    else:
        a, b = rot[..., :half], rot[..., half:]
        out = torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)
    out = out.to(x.dtype)
    return torch.cat([out, rest], dim=-1) if rest.shape[-1] else out


@builtin("rotary q/k rotation, rotate-half or interleaved (Su 2021)", aliases=("rotary",))
class Rope(PositionScheme):
    """base: ω base (10000; LLaMA-3 500000). rotary_dim: d_r, dims rotated per head (null = head
    dim; must be even). interleaved: pair (2k, 2k+1) instead of (k, k + d_r/2). scaling: a
    ``rope_scaling`` component (linear, ntk, dynamic, yarn, llama3) or null."""

    def __init__(self, dim: int, head_dim: int, heads: int, max_seq_len: int,
                 base: PositiveFloat = 10000.0, rotary_dim: PositiveInt | None = None,
                 interleaved: bool = False, scaling: Spec["rope_scaling"] | None = None) -> None:  # noqa: F821
        super().__init__(dim, head_dim, heads, max_seq_len)
        self.rotary_dim = rotary_dim or head_dim
        if self.rotary_dim % 2 or self.rotary_dim > head_dim:
            raise ConfigError(
                f"rope rotary_dim={self.rotary_dim} must be even and at most head_dim={head_dim}")
        self.base = base
        self.interleaved = interleaved
        self.scaling = scaling() if scaling is not None else None  # a factory of the scaling rule

    def rotary(self) -> Rotary:
        scaling = self.scaling
        context = (scaling.original_max_seq_len if scaling is not None else None) or self.max_seq_len
        return Rotary(self.angles, float(self.base), self.rotary_dim, context,
                      scaling.factor if scaling is not None else 1.0)

    def angles(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """cos, sin of p·ω_k for positions (B|1, T) -> (B|1, 1, T, d_r/2), float32."""
        inv_freq = rope_inv_freq(self.rotary_dim, self.base, positions.device)
        factor = 1.0
        if self.scaling is not None:
            inv_freq, factor = self.scaling.frequencies(
                inv_freq, rotary_dim=self.rotary_dim, base=self.base,
                max_seq_len=self.max_seq_len, positions=positions)
        # An elementwise product in float64, not a matmul: TF32 matmuls truncate large positions,
        # and a float32 p·ω is off by ~0.03 rad at p = 1e6. The (B|1, 1, T, d_r/2) table is tiny.
        theta = positions.to(torch.float64)[:, None, :, None] * inv_freq.to(torch.float64)
        cos, sin = theta.cos().to(torch.float32), theta.sin().to(torch.float32)
        if factor == 1.0:
            return cos, sin
        return cos * factor, sin * factor

    def prepare(self, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        """cos/sin of the forward's new tokens, computed once and shared by every layer."""
        return self.angles(q_pos)

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor,
               prepared: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        """q (B, H, T, D) at q_pos (B|1, T) and k (B, K, T', D) at k_pos, both rotated.
        ``prepared``: ``prepare``'s cos/sin for q_pos (the core passes it; computed if absent)."""
        cos, sin = prepared if prepared is not None else self.angles(q_pos)
        q = rotate(q, cos, sin, self.interleaved)
        if k_pos is not q_pos:
            cos, sin = self.angles(k_pos)
        return q, rotate(k, cos, sin, self.interleaved)
