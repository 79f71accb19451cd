"""A diagonal linear recurrence in plain PyTorch (not a mixer of its own): every channel decays by
its own token-dependent factor and takes its own input,

    h_t = exp(g_t) ⊙ h_{t−1} + b_t,        g_t ≤ 0 the log-decay, b_t the input, h (B, D)

— Griffin's RG-LRU (De et al., 2024) and HGRN (Qin et al., 2023) are this recurrence. Mamba's
selective scan (``_selective_scan``) is one too, but takes its input as Δ_t B_t u_t: writing b_t in
that form divides by Δ, which is not exact where the decay vanishes, so this module carries b_t as
it is and reuses that module's chunk length rule instead.

The chunked form, for every chunk at once: within a chunk of L tokens, with S_t = Σ_{s≤t} g_s the
log-decay since the chunk began (≤ 0) and h_0 the state before it,

    h_t = exp(S_t) ⊙ (h_0 + Σ_{s≤t} exp(−S_s) ⊙ b_s)

— one ``cumsum`` over the chunk instead of L dependent steps. The states before the chunks are
carried in a Python loop over the T / L chunks, on (B, D) tensors. exp(−S_s) grows as the chunk
decays, so the chunk length is chosen per call by ``_selective_scan.chunk_length`` to keep |S| ≤
its ``LOG_DECAY_LIMIT`` (40; the bound comes from the gradient of exp(−S)). T not a multiple of L:
the last chunk is padded with g = 0, b = 0 (no decay, no input) and the padded outputs dropped.

On CUDA with flash-linear-attention installed (and ``SEQZOO_SCAN`` not ``torch``), fla's HGRN
kernels run the same recurrence: ``chunk_hgrn`` for sequences (its backward leaves the initial
state without a gradient), ``fused_recurrent_hgrn`` for a decode step without autograd.
"""
from __future__ import annotations

import functools
import os

import torch
from torch import Tensor

from ._chunks import in_chunks
from ._selective_scan import chunk_length


def chunked_scan(g: Tensor, b: Tensor, h: Tensor | None = None, chunk: int = 64) -> tuple[Tensor, Tensor]:
    """The chunked form. g ≤ 0, b (B, T, D); h (B, D) the state before the first token (zeros if
    None) -> (h_1..h_T (B, T, D), h_T (B, D)), in float32 or wider. ``chunk``: the longest chunk
    tried (64), shortened so no chunk decays by more than e^−40."""
    batch, length, width = b.shape
    dtype = torch.promote_types(b.dtype, torch.float32)
    g, b = g.to(dtype), b.to(dtype)
    h = b.new_zeros(batch, width) if h is None else h.to(dtype)
    step = chunk_length(-g.detach(), g.new_ones(width, 1), chunk)  # a rate of 1: Σ|g| per chunk ≤ 40
    g, b = in_chunks(g, step), in_chunks(b, step)                  # (B, N, L, D), zeros: neutral steps
    S = g.cumsum(2)                                                 # S_t, ≤ 0
    decay = S.exp()
    local = decay * (b * (-S).exp()).cumsum(2)                      # each chunk from a zero state
    starts = []
    # One unbind, not a slice per chunk: the backward of x[:, n] writes a zero gradient of the
    # whole length for every chunk, an unbind's backward stacks once.
    for total, end in zip(decay[:, :, -1].unbind(1), local[:, :, -1].unbind(1)):
        starts.append(h)
        h = total * h + end
    states = local + decay * torch.stack(starts, 1)[:, :, None]     # (B, N, L, D)
    return states.flatten(1, 2)[:, :length], h


def step(g: Tensor, b: Tensor, h: Tensor) -> Tensor:
    """One token, for decoding: g, b (B, D); h (B, D) -> the new h, in h's dtype."""
    return g.to(h.dtype).exp() * h + b.to(h.dtype)


@functools.cache
def _fla_kernels() -> tuple | None:
    """fla's (chunk_hgrn, fused_recurrent_hgrn), or None."""
    try:
        from fla.ops.hgrn import chunk_hgrn, fused_recurrent_hgrn
    except ImportError:
        return None
    return chunk_hgrn, fused_recurrent_hgrn


def diagonal_scan(g: Tensor, b: Tensor, h: Tensor | None, chunk: int) -> tuple[Tensor, Tensor]:
    """h_t = exp(g_t) ⊙ h_{t−1} + b_t over g, b (B, T, D) from h (B, D) float32 or None ->
    (h_1..h_T (B, T, D), h_T (B, D)), float32 or wider. fla's kernels on CUDA when installed (see the
    module's notes); else one step for a single token with a state, the chunked form otherwise."""
    kernels = _fla_kernels() if b.is_cuda and os.environ.get("SEQZOO_SCAN") != "torch" else None
    if kernels is not None:
        decode = b.shape[1] == 1 and h is not None and not torch.is_grad_enabled()
        kernel = kernels[1] if decode else kernels[0]  # fused_recurrent: no backward
        return kernel(b.float(), g.float(), initial_state=None if h is None else h.float(), output_final_state=True)
    with torch.autocast(b.device.type, enabled=False):
        if b.shape[1] == 1 and h is not None:
            h = step(g[:, 0], b[:, 0], h)
            return h[:, None], h
        return chunked_scan(g, b, h, chunk)
