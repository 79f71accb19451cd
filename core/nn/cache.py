"""The decoding cache: one state per layer (a preallocated key/value slice for attention, a
fixed-size state for recurrent mixers) and the positions of every slot.

Keys and values of each attention layer live in a (B, K, max_len, D) buffer written in place, so
decoding allocates nothing per step. (One buffer per layer, not one for all: a compiled step then mutates
its inputs directly, where a view into a shared buffer made the compiler copy all of it.)
Positions are kept per slot so position schemes can read the absolute position of every cached key.

A cache can switch to *static* decoding (``make_static``): every later step writes its one token
at the slot held in a tensor and attends over the whole buffer, masked by ``valid``. Then no shape
and no Python number changes from step to step, so ``torch.compile`` traces the decode step once.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..errors import InputError
from ..interfaces import MixerState


class KVSlice(MixerState):
    """One attention layer's cached keys and values: (B, K, max_len, D) buffers written in place
    at the slots the model-level ``DecodeCache`` says."""

    def __init__(self, batch: int, kv_heads: int, head_dim: int, max_len: int, *,
                 device: torch.device | str | None = None, dtype: torch.dtype = torch.float32,
                 value_dim: int | None = None) -> None:
        self.k = torch.zeros(batch, kv_heads, max_len, head_dim, device=device, dtype=dtype)
        self.v = torch.zeros(batch, kv_heads, max_len, value_dim or head_dim, device=device, dtype=dtype)

    def write(self, cache: DecodeCache, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store k, v (B, K, T, D) after the ``cache.length`` cached slots; return all keys and
        values so far, (B, K, length + T, D), as views of the buffer. A static cache writes one
        token at ``cache.slot`` and returns the whole buffer (B, K, max_len, D)."""
        if cache.slot is not None:  # index_copy_ does not cast (autocast hands us bfloat16)
            self.k.index_copy_(2, cache.slot, k.to(self.k.dtype))
            self.v.index_copy_(2, cache.slot, v.to(self.v.dtype))
            return self.k, self.v
        start, end = cache.length, cache.length + k.shape[2]
        self.k[:, :, start:end] = k
        self.v[:, :, start:end] = v
        return self.k[:, :, :end], self.v[:, :, :end]

    def reorder(self, rows: Tensor) -> None:
        self.k = self.k.index_select(0, rows)
        self.v = self.v.index_select(0, rows)


class DecodeCache:
    """A model's decoding state, whatever its mixers: one ``MixerState`` per layer (``states``,
    made by each layer's mixer: a ``KVSlice`` for attention, a fixed-size state for a recurrent
    mixer), the absolute position of every slot, and ``length``, the number of slots filled."""

    def __init__(self, states: list[MixerState], batch: int, max_len: int, *,
                 device: torch.device | str | None = None) -> None:
        self.max_len = max_len
        self.states = states
        self.positions = torch.zeros(batch, max_len, dtype=torch.long, device=device)
        self.length = 0
        #: Static decoding: the slot (1,) the next token goes to, and which slots (B, max_len)
        #: hold real keys. None while the cache grows by slicing.
        self.slot: Tensor | None = None
        self.valid: Tensor | None = None
        # Per-layer extras (cross-attention keys/values of an encoder memory), keyed by layer.
        self.memory: dict[int, tuple[Tensor, Tensor]] = {}

    def check_room(self, new: int) -> None:
        if self.length + new > self.max_len:
            raise InputError(
                f"decode cache full: {self.length} cached + {new} new tokens > max_len={self.max_len}; "
                f"create the cache with a larger max_len"
            )

    def advance(self, positions: Tensor) -> None:
        """Record the positions (B|1, T) of the tokens just written by every layer."""
        t = positions.shape[-1]
        self.positions[:, self.length:self.length + t] = positions
        self.length += t

    def make_static(self, key_padding: Tensor | None = None) -> None:
        """Switch to static decoding after the prompt: slots ``[0, length)`` are valid where
        ``key_padding`` (B, length) is 1 (all of them when None)."""
        self.valid = torch.zeros(self.positions.shape, dtype=torch.bool, device=self.positions.device)
        self.valid[:, :self.length] = True if key_padding is None else key_padding[:, -self.length:].bool()
        self.slot = torch.tensor([self.length], device=self.positions.device)

    def write_static(self, positions: Tensor) -> Tensor:
        """Static decoding: record the position (B|1, 1) of the token at ``slot`` before the layers
        run -> the boolean (B, max_len) slots it may attend to. Reads no Python number."""
        self.positions.index_copy_(1, self.slot, positions.expand(self.positions.shape[0], 1))
        self.valid.index_fill_(1, self.slot, True)
        return self.valid

    def step_static(self) -> None:
        """After a static decode step ran every layer: the next token goes to the next slot."""
        self.length += 1
        self.slot += 1

    def reorder(self, rows: Tensor) -> None:
        """Keep batch rows ``rows`` (B',) in that order — beam search follows its surviving beams."""
        for state in self.states:
            state.reorder(rows)
        self.positions = self.positions.index_select(0, rows)
        if self.valid is not None:
            self.valid = self.valid.index_select(0, rows)
        self.memory = {layer: (k.index_select(0, rows), v.index_select(0, rows))
                       for layer, (k, v) in self.memory.items()}
