"""Chunking for the chunked parallel forms of the recurrent mixers (not a mixer of its own).

A chunked form splits T into chunks of L tokens: within a chunk it works in parallel (matrix
products), across chunks it carries the state. T need not be a multiple of L: the last chunk is
padded with steps that change nothing (a zero key and value, no decay: the caller passes the
neutral value of each tensor), so the state after the padding is the state after the last real
token, and the padded outputs are dropped.
"""
from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def pad_time(x: Tensor, chunk: int, value: float = 0.0, dim: int = 1) -> Tensor:
    """``x`` padded with ``value`` along ``dim`` (time) to a multiple of ``chunk`` steps."""
    extra = -x.shape[dim] % chunk
    if not extra:
        return x
    pad = [0, 0] * (x.dim() - 1 - dim % x.dim()) + [0, extra]
    return F.pad(x, pad, value=value)


def in_chunks(x: Tensor, chunk: int, value: float = 0.0) -> Tensor:
    """(B, T, ...) -> (B, N, L, ...): padded with ``value`` to N = ⌈T / L⌉ chunks of L steps."""
    x = pad_time(x, chunk, value)
    return x.unflatten(1, (x.shape[1] // chunk, chunk))
