"""Learned absolute positions (GPT-2, BERT): x_p = E_tok[token_p] + E_pos[p].

A trainable table of ``max_seq_len`` rows; positions at or past it have no row (hard limit).
"""
from __future__ import annotations

from torch import Tensor, nn

from seqzoo.interfaces import PositionScheme
from seqzoo.registry import builtin


@builtin("trainable absolute position table (GPT-2, BERT)", aliases=("absolute",))
class LearnedPosition(PositionScheme):
    """E_pos ∈ R^{max_seq_len × C}, added to token embeddings. No recipe parameters."""

    def __init__(self, dim: int, head_dim: int, heads: int, max_seq_len: int) -> None:
        super().__init__(dim, head_dim, heads, max_seq_len)
        self.table = nn.Embedding(max_seq_len, dim)
        self.max_positions = max_seq_len

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        """x (B, T, C) + E_pos[positions (B|1, T)]."""
        return x + self.table(positions)
