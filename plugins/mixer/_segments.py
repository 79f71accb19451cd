"""Long sequences through a recurrent mixer in segments, when no gradient is wanted.

A recurrent mixer's whole-sequence forward holds scratch tensors proportional to T (Mamba's
(B, T, E) projections and conv outputs, the scan's per-chunk states). Its state makes T tokens fed
in pieces equal T fed at once, so without autograd (inference, a long prefill) the sequence can run
``SEGMENT`` tokens at a time through a state: the scratch memory is then bounded by the segment,
whatever T, which attention — whose every query reads every key — cannot do. With autograd on,
every segment's tensors would be kept for the backward anyway, so the plain forward runs.
"""
from __future__ import annotations

import torch
from torch import Tensor

from seqzoo.interfaces import Mixer, MixerContext, MixerState

#: Tokens per segment: long enough that the per-segment Python work is noise beside the products.
SEGMENT = 1024


def in_segments(mixer: Mixer, x: Tensor, context: MixerContext, state: MixerState | None,
                segment: int | None = None) -> Tensor | None:
    """mixer(x) (B, T, C) computed ``segment`` (default ``SEGMENT``) tokens at a time through ``state`` (a fresh one if
    None), or None when that does not apply: T ≤ segment, or autograd is recording. Only
    ``context.padding`` is cut per segment: the recurrent mixers read nothing else of it."""
    batch, length, _ = x.shape
    segment = segment or SEGMENT
    if length <= segment or (torch.is_grad_enabled() and (x.requires_grad or any(
            p.requires_grad for p in mixer.parameters()))):
        return None
    state = state if state is not None else mixer.new_state(batch, length, device=x.device, dtype=x.dtype)
    out = None
    for start in range(0, length, segment):
        piece = slice(start, start + segment)
        padding = None if context.padding is None else context.padding[:, piece]
        y = mixer(x[:, piece], context.replace(padding=padding), state)
        if out is None:
            out = y.new_empty(batch, length, y.shape[-1])
        out[:, piece] = y
    return out
