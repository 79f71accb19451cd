"""ALiBi, attention with linear biases (Press, Smith & Lewis, 2022).

    bias[h, i, j] = −m_h·|p_i − p_j|,    m_h = 2^(−8h/n) for heads h = 1..n, n a power of two

No position embeddings: head h adds that bias to the (already scaled) logits. Other head counts
take the c = 2^⌊log2 n⌋ power-of-two slopes followed by the odd-indexed slopes of 2c heads (the
paper repo's ``get_slopes``, BLOOM, MPT).
For causal attention |p_i − p_j| = p_i − p_j on every visible key, and the symmetric form is the
usual choice for bidirectional encoders (MosaicBERT), so one formula serves both.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from seqzoo.interfaces import PositionBias
from seqzoo.registry import builtin

from ._distance import distance_at


def alibi_slopes(heads: int) -> list[float]:
    """The per-head slopes m_1..m_n for n = ``heads``, in head order (not monotone unless n = 2^k)."""
    closest = 2 ** math.floor(math.log2(heads))
    slopes = [2.0 ** (-8.0 * h / closest) for h in range(1, closest + 1)]
    # The odd-indexed slopes of 2·closest heads fill the remaining heads.
    slopes += [2.0 ** (-4.0 * (2 * h - 1) / closest) for h in range(1, heads - closest + 1)]
    return slopes


@builtin("per-head linear distance bias −m_h·|i−j|, no embeddings (Press 2022)")
class Alibi(PositionBias):
    """Linear distance penalties per head; no recipe parameters and no learned weights.

    The slopes are recomputed in float32 on every call (never a buffer), so casting the model to
    bf16/fp16 cannot round them, and the bias itself is built in float32 before the cast.
    """

    def __init__(self, dim: int, head_dim: int, heads: int, max_seq_len: int) -> None:
        super().__init__(dim, head_dim, heads, max_seq_len)
        self.slopes = alibi_slopes(heads)

    def by_distance(self, distances: Tensor) -> Tensor:
        """distances (R,) int64 -> −m_h·|r|, (H, R) float32: the bias depends on the distance alone;
        built once per forward and shared by every layer."""
        slopes = torch.tensor(self.slopes, dtype=torch.float32, device=distances.device)  # (H,)
        return -slopes[:, None] * distances.abs().to(torch.float32)

    def score_mod(self, q_pos: Tensor, k_pos: Tensor, prepared: object = None):
        """The same bias for FlexAttention, one logit at a time: score − m_h·|q_pos_i − k_pos_j|."""
        slopes = torch.tensor(self.slopes, dtype=torch.float32, device=q_pos.device)  # (H,)
        distance = distance_at(q_pos, k_pos)

        def alibi(score, b, h, q, kv):
            return score - slopes[h] * distance(b, q, kv)

        return alibi
