"""Distances between query and key positions one logit at a time, for FlexAttention's score_mod in
the schemes that bias logits by them (ALiBi, hard ALiBi); the tables come from ``by_distance``."""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def distance_at(q_pos: Tensor, k_pos: Tensor) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
    """|p_q − p_kv| of batch row b as a function of FlexAttention's (b, q, kv) indices, float32;
    positions shared by every row ((1, T) or (T,)) are read from row 0."""
    q_pos, k_pos = torch.atleast_2d(q_pos), torch.atleast_2d(k_pos)
    q_rows, k_rows = q_pos.shape[0] > 1, k_pos.shape[0] > 1

    def distance(b: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        return (q_pos[b if q_rows else 0, q] - k_pos[b if k_rows else 0, kv]).abs().to(torch.float32)

    return distance
