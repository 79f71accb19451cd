"""T5 relative position bias (Raffel et al., 2020; HF ``T5Attention``).

    bias[h, i, j] = E[bucket(p_j − p_i), h],    E ∈ R^{num_buckets × H} learned

Distances below
max_exact = nb/2 get a bucket each; larger ones share log-spaced buckets up to ``max_distance``:
bucket = min(nb − 1, max_exact + ⌊ln(n/max_exact) / ln(max_distance/max_exact) · (nb − max_exact)⌋).
Encoders (bidirectional) split the buckets between keys before and after the query (nb = N/2);
decoders (causal) give all N buckets to keys at or before the query.

T5 itself adds the bias to unscaled logits (it has no 1/√D); here it is added after whatever scale
the recipe's score applies, so pair it with ``{kind: scaled_dot, scale: 1.0}`` to match T5.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from seqzoo.errors import ConfigError
from seqzoo.interfaces import PositionBias
from seqzoo.registry import builtin
from seqzoo.schema import PositiveInt


def relative_bucket(relative_position: Tensor, *, bidirectional: bool, num_buckets: int = 32,
                    max_distance: int = 128) -> Tensor:
    """Bucket index for relative positions r = p_key − p_query (any shape, integer) -> same shape, int64."""
    if bidirectional:
        num_buckets //= 2
        offset = (relative_position > 0).long() * num_buckets  # keys after the query
        n = relative_position.abs()
    else:
        offset = torch.zeros_like(relative_position)
        n = (-relative_position).clamp(min=0)  # future keys collapse to 0; the mask hides them
    max_exact = num_buckets // 2
    # Clamping before the log keeps log(0) out of the graph (export/compile safe); the where below
    # discards those entries anyway. The log is taken in float32, as HF does, so the bucket
    # boundaries match checkpoints trained with it.
    scaled = torch.log(n.clamp(min=max_exact).float() / max_exact) / math.log(max_distance / max_exact)
    log_bucket = max_exact + (scaled * (num_buckets - max_exact)).long()  # truncation toward zero
    log_bucket = log_bucket.clamp(max=num_buckets - 1)
    return offset + torch.where(n < max_exact, n, log_bucket)


@builtin("learned per-head bias over log-spaced distance buckets (Raffel 2020)")
class T5RelativeBias(PositionBias):
    """A learned per-head scalar for each bucket of relative distance, one table per stack.

    num_buckets: buckets N (32); encoders use N/2 per direction. max_distance: the distance from
    which every farther key shares the last bucket (128). The direction rule follows
    ``self.causal``, which the owning stack sets (True in decoders, False in encoders).
    """

    def __init__(self, dim: int, head_dim: int, heads: int, max_seq_len: int,
                 num_buckets: PositiveInt = 32, max_distance: PositiveInt = 128) -> None:
        super().__init__(dim, head_dim, heads, max_seq_len)
        if num_buckets < 4:
            raise ConfigError(
                f"t5 num_buckets={num_buckets} must be at least 4 (an encoder splits them into two "
                f"directions, each needing exact and log-spaced buckets); use the default 32")
        if max_distance <= num_buckets // 2:
            raise ConfigError(
                f"t5 max_distance={max_distance} must be greater than num_buckets // 2 = "
                f"{num_buckets // 2} (the distances bucketed exactly); raise max_distance (default 128)")
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.table = nn.Embedding(num_buckets, heads)  # E, (N, H)

    def by_distance(self, distances: Tensor) -> Tensor:
        """distances (R,) int64 -> E[bucket(r)]ᵀ, (H, R): the bias depends on the distance alone. It
        is looked up once per forward and shared by every layer (T5 computes it in the first layer
        and passes it on)."""
        buckets = relative_bucket(distances, bidirectional=not self.causal, num_buckets=self.num_buckets,
                                  max_distance=self.max_distance)
        return self.table(buckets).T

    def score_mod(self, q_pos: Tensor, k_pos: Tensor, prepared: object = None):
        """The same bias for FlexAttention, one logit at a time: score + E[bucket(k_pos_j − q_pos_i), h]."""
        q_pos, k_pos = torch.atleast_2d(q_pos), torch.atleast_2d(k_pos)
        q_rows, k_rows = q_pos.shape[0] > 1, k_pos.shape[0] > 1
        table, bidirectional = self.table.weight, not self.causal  # (N, H)

        def t5(score, b, h, q, kv):
            relative = k_pos[b if k_rows else 0, kv] - q_pos[b if q_rows else 0, q]
            bucket = relative_bucket(relative, bidirectional=bidirectional, num_buckets=self.num_buckets,
                                     max_distance=self.max_distance)
            return score + table[bucket, h]

        return t5
