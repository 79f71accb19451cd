"""Relative position representations (Shaw, Uszkoreit & Vaswani, 2018), key term only.

    e_ij = q_i·(k_j + a_ij) / √D,    a_ij = w_{clip(p_j − p_i, k)} learned for offsets −k..k

The score computes q_i·k_j / √D; this scheme adds the rest, q_i·a_ij / √D, as a bias. The value term
a^V (which the paper found adds little) is not included. One table is shared by all heads and all
layers of the stack (the paper's big model shares across heads; it keeps one table per layer).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from seqzoo.interfaces import PositionScheme
from seqzoo.registry import builtin
from seqzoo.schema import PositiveInt


@builtin("clipped learned relative key embeddings, q·a_ij bias (Shaw 2018)")
class ShawRelative(PositionScheme):
    """Learned clipped relative key embeddings w_r ∈ R^D for r ∈ [−k, k], shared across heads.

    max_distance: k, the offset beyond which keys share the edge embedding (16, the paper's base
    model). The bias is divided by √D, so it assumes the score scales q·k by 1/√D (``scaled_dot``
    with its default scale); with another scale the two terms are weighted differently.
    """

    def __init__(self, dim: int, head_dim: int, heads: int, max_seq_len: int,
                 max_distance: PositiveInt = 16) -> None:
        super().__init__(dim, head_dim, heads, max_seq_len)
        self.max_distance = max_distance
        self.table = nn.Embedding(2 * max_distance + 1, head_dim)  # row r + k holds w_r, (2k+1, D)

    def bias(self, q: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """q_i·w_{clip(k_pos_j − q_pos_i)} / √D: q (B, H, T, D), q_pos (B|1, T), k_pos (B|1, S)
        -> (B, H, T, S)."""
        k = self.max_distance
        q_pos, k_pos = torch.atleast_2d(q_pos), torch.atleast_2d(k_pos)
        # Each query meets at most 2k+1 distinct embeddings: score against all of them once, then
        # pick per key, instead of gathering a (T, S, D) table.
        per_offset = q @ self.table.weight.to(q.dtype).t() / math.sqrt(self.head_dim)  # (B, H, T, 2k+1)
        index = (k_pos[:, None, :] - q_pos[:, :, None]).clamp(-k, k) + k  # (B|1, T, S)
        b, h, t, _ = q.shape
        index = index[:, None].expand(b, h, t, index.shape[-1])  # (B, H, T, S)
        return per_offset.gather(-1, index)
