"""Distances between query and key positions, for the schemes that bias logits by them (ALiBi,
hard ALiBi): as a table for the materialised path, one logit at a time for FlexAttention."""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def relative_distance(q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """p_i − p_j for q_pos (B|1, T) or (T,) and k_pos (B|1, S) or (S,) -> (B|1, T, S), int64."""
    q_pos, k_pos = torch.atleast_2d(q_pos), torch.atleast_2d(k_pos)
    return q_pos[:, :, None] - k_pos[:, None, :]


def distance_at(q_pos: Tensor, k_pos: Tensor) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
    """|p_q − p_kv| of batch row b as a function of FlexAttention's (b, q, kv) indices, float32;
    positions shared by every row ((1, T) or (T,)) are read from row 0."""
    q_pos, k_pos = torch.atleast_2d(q_pos), torch.atleast_2d(k_pos)
    q_rows, k_rows = q_pos.shape[0] > 1, k_pos.shape[0] > 1

    def distance(b: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        return (q_pos[b if q_rows else 0, q] - k_pos[b if k_rows else 0, kv]).abs().to(torch.float32)

    return distance
