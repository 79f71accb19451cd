"""Sinusoidal absolute positions (Vaswani et al., 2017), the paper's interleaved layout:
PE[p, 2k] = sin(p / base^(2k/C)), PE[p, 2k+1] = cos(p / base^(2k/C)).

No parameters; computed in float32 for the positions at hand, so any position works.
"""
from __future__ import annotations

import torch
from torch import Tensor

from seqzoo.interfaces import PositionScheme
from seqzoo.registry import builtin
from seqzoo.schema import PositiveFloat


def sinusoid_table(positions: Tensor, dim: int, base: float = 10000.0) -> Tensor:
    """PE for integer positions (...,) -> (..., dim) in float32 (odd dim: the last sin column kept)."""
    pairs = torch.arange(0, dim, 2, device=positions.device, dtype=torch.float32)
    inv_freq = base ** (-pairs / dim)  # (ceil(C/2),)
    angles = positions.to(torch.float32)[..., None] * inv_freq
    table = torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(-2)  # sin, cos interleaved
    return table[..., :dim]


@builtin("fixed sin/cos absolute positions, interleaved (Vaswani 2017)")
class Sinusoidal(PositionScheme):
    """base: the wavelength base (default 10000)."""

    def __init__(self, dim: int, head_dim: int, heads: int, max_seq_len: int,
                 base: PositiveFloat = 10000.0) -> None:
        super().__init__(dim, head_dim, heads, max_seq_len)
        self.base = base

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        """x (B, T, C) + PE[positions (B|1, T)]."""
        return x + sinusoid_table(positions, self.dim, self.base).to(x.dtype)
