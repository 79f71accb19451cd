"""A preallocated key/value cache for incremental decoding.

Keys and values of every layer live in one (layers, B, K, max_len, D) buffer written in place, so
decoding allocates nothing per step. Positions are kept per slot so position schemes can read the
absolute position of every cached key.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .errors import InputError


class KVCache:
    """Cached keys/values for ``layers`` attention layers; ``length`` slots are filled."""

    def __init__(self, layers: int, batch: int, kv_heads: int, head_dim: int, max_len: int,
                 *, device: torch.device | str | None = None, dtype: torch.dtype = torch.float32,
                 value_dim: int | None = None) -> None:
        self.max_len = max_len
        self.k = torch.zeros(layers, batch, kv_heads, max_len, head_dim, device=device, dtype=dtype)
        self.v = torch.zeros(layers, batch, kv_heads, max_len, value_dim or head_dim, device=device, dtype=dtype)
        self.positions = torch.zeros(batch, max_len, dtype=torch.long, device=device)
        self.length = 0
        # Per-layer extras (cross-attention keys/values of an encoder memory), keyed by layer.
        self.memory: dict[int, tuple[Tensor, Tensor]] = {}

    def check_room(self, new: int) -> None:
        if self.length + new > self.max_len:
            raise InputError(
                f"KV cache full: {self.length} cached + {new} new tokens > max_len={self.max_len}; "
                f"create the cache with a larger max_len"
            )

    def write(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store k, v (B, K, T, D) after the cached slots of ``layer``; return all keys and values
        so far, (B, K, length + T, D), as views of the buffer."""
        start, end = self.length, self.length + k.shape[2]
        self.k[layer, :, :, start:end] = k
        self.v[layer, :, :, start:end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def advance(self, positions: Tensor) -> None:
        """Record the positions (B|1, T) of the tokens just written by every layer."""
        t = positions.shape[-1]
        self.positions[:, self.length:self.length + t] = positions
        self.length += t

    def reorder(self, rows: Tensor) -> None:
        """Keep batch rows ``rows`` (B',) in that order — beam search follows its surviving beams."""
        self.k = self.k.index_select(1, rows)
        self.v = self.v.index_select(1, rows)
        self.positions = self.positions.index_select(0, rows)
        self.memory = {layer: (k.index_select(0, rows), v.index_select(0, rows))
                       for layer, (k, v) in self.memory.items()}
