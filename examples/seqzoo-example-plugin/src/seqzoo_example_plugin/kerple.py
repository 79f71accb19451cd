"""KERPLE, logarithmic variant (Chi, Fan, Ramadge & Rudnicky, 2022, "KERPLE: Kernelized Relative
Positional Embedding for Length Extrapolation").

    bias[h, i, j] = −r1_h · ln(1 + r2_h · |p_i − p_j|),    r1_h, r2_h > 0 learned per head

Like ALiBi it adds a distance penalty to the logits and has no embeddings, but the penalty grows
logarithmically and each head learns its own strength and shape. Positivity is kept by learning
r = softplus(ρ) (the paper clamps r instead).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqzoo.interfaces import PositionScheme
from seqzoo.schema import PositiveFloat


def _inverse_softplus(y: float) -> float:
    return y + math.log(-math.expm1(-y))  # softplus(x) = y  <=>  x = y + ln(1 − e^−y)


class KerpleLog(PositionScheme):
    """Learned log-distance bias per head; one (r1, r2) pair per head, shared by the stack's layers.

    r1: initial strength r1 of every head (1.0). r2: initial distance scale r2 (1.0).
    """

    def __init__(self, dim: int, head_dim: int, heads: int, max_seq_len: int,
                 r1: PositiveFloat = 1.0, r2: PositiveFloat = 1.0) -> None:
        super().__init__(dim, head_dim, heads, max_seq_len)
        self.rho1 = nn.Parameter(torch.full((heads,), _inverse_softplus(r1)))  # (H,)
        self.rho2 = nn.Parameter(torch.full((heads,), _inverse_softplus(r2)))  # (H,)

    def bias(self, q: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """−r1·ln(1 + r2·|q_pos_i − k_pos_j|): q (B, H, T, D), q_pos (B|1, T), k_pos (B|1, S)
        -> (B|1, H, T, S) in q's dtype (computed in at least float32)."""
        dtype = torch.promote_types(q.dtype, torch.float32)
        q_pos, k_pos = torch.atleast_2d(q_pos), torch.atleast_2d(k_pos)
        distance = (q_pos[:, :, None] - k_pos[:, None, :]).abs().to(dtype)  # (B|1, T, S)
        r1 = F.softplus(self.rho1.to(dtype))[:, None, None]  # (H, 1, 1)
        r2 = F.softplus(self.rho2.to(dtype))[:, None, None]
        return (-r1 * torch.log1p(r2 * distance[:, None])).to(q.dtype)  # (B|1, H, T, S)
