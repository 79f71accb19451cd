"""RWKV-4's WKV in plain PyTorch, for the ``rwkv4`` mixer (not a mixer of its own): a parallel scan
for sequences, the one-token step for decoding, flash-linear-attention's ``fused_recurrent_rwkv4``
on CUDA when ``fla`` is installed.

Per channel, with w = −e^{time_decay} < 0 and the bonus u = ``time_first``,

    wkv_t = (num_{t−1} + e^{u+k_t} v_t) / (den_{t−1} + e^{u+k_t}),
    num_t = e^{w} num_{t−1} + e^{k_t} v_t,      den_t = e^{w} den_{t−1} + e^{k_t}

(``seqzoo.reference.rwkv4.wkv4``). e^{k} overflows float32 past k ≈ 88, so a state is a triple
(m, a, b) holding num = a·e^{m}, den = b·e^{m}, m the largest exponent. Two such triples chain
(``combine``): a prefix ending at m₁, decayed by d = w · (its tokens since), then a later stretch
ending at m₂, make

    m = max(m₁ + d, m₂),   a = a₁ e^{m₁+d−m} + a₂ e^{m₂−m},   b = b₁ e^{m₁+d−m} + b₂ e^{m₂−m}

— every exponent ≤ 0 whatever k and w, and the operation is associative. Why not a cumulative sum,
as ``_diagonal_scan`` runs its recurrence: its chunked form scales each chunk by e^{±(its decay)},
which must stay inside float32, so its chunk length shrinks to keep Σ|g| ≤ 40; RWKV-4 starts some
channels at w ≈ −20 per token (time_decay up to 3), which would leave chunks of two tokens, and a
jump of k by more than ~80 inside a chunk breaks any one scale per chunk. The triples need no
such bound.

The scan: in chunks of L tokens (a power of two), every chunk at once, a Sklansky prefix scan —
log₂ L rounds, each chaining the left half of every block of 2h tokens into each token of its right
half — gives each token its chunk's triple up to it; a Python loop over the T / L chunks chains the
chunks (on (B, A) tensors); one more ``combine`` puts the state before each chunk in front of its
tokens. Work is O(T · A · log L), with no per-token step. The outputs do not depend on the scales
m, but the state does (it holds them), and its gradient is the recurrence's: m is differentiated as
the recurrence's own maximum is.

Padded positions (``real`` = 0) are the empty triple and add no decay. Shape legend: B batch,
T length, A channels, N chunks of L tokens.
"""
from __future__ import annotations

import functools
import os

import torch
from torch import Tensor

#: The scale m of an empty state: below every exponent (transformers' −1e38); a combine keeps it finite.
EMPTY = -1e38

Triple = tuple[Tensor, Tensor, Tensor]  # (m, a, b): num = a·e^m, den = b·e^m


def combine(before: Triple, after: Triple, decay: Tensor) -> Triple:
    """The triple of ``before`` decayed by ``decay`` (≤ 0) and then ``after`` (the module's notes)."""
    (m1, a1, b1), (m2, a2, b2) = before, after
    reached = m1 + decay
    m = torch.maximum(reached, m2)
    e1, e2 = torch.exp(reached - m), torch.exp(m2 - m)
    return m, a1 * e1 + a2 * e2, b1 * e1 + b2 * e2


def _blocks(x: Tensor, chunk: int, value: float) -> Tensor:
    """(B, T, D) -> (B, N, L, D), padded after the end with ``value``."""
    pad = -x.shape[1] % chunk
    if pad:
        x = torch.cat([x, x.new_full((x.shape[0], pad, x.shape[2]), value)], 1)
    return x.unflatten(1, (-1, chunk))


def _within_chunks(m: Tensor, a: Tensor, b: Tensor, count: Tensor, w: Tensor) -> Triple:
    """Sklansky's prefix scan inside every chunk: (B, N, L, A) triples of single tokens and count
    (B, N, L, 1), the real tokens up to each -> the triples of each chunk's tokens up to each."""
    length, half = m.shape[2], 1
    while half < length:
        blocks = (length // (2 * half), 2, half)                    # (B, N, L, .) -> (B, N, L / 2h, 2, h, .)
        m, a, b, n = (t.unflatten(2, blocks) for t in (m, a, b, count))
        end = tuple(t[:, :, :, 0, -1:] for t in (m, a, b))     # each block's left half, up to its end
        right = tuple(t[:, :, :, 1] for t in (m, a, b))
        joined = combine(end, right, w * (n[:, :, :, 1] - n[:, :, :, 0, -1:]))
        m, a, b = (torch.stack([t[:, :, :, 0], j], 3).flatten(2, 4) for t, j in zip((m, a, b), joined))
        half *= 2
    return m, a, b


def wkv_scan(w: Tensor, u: Tensor, k: Tensor, v: Tensor, state: Triple | None, chunk: int,
             real: Tensor | None = None) -> tuple[Tensor, Triple]:
    """The parallel scan. w (A,) < 0, u (A,), k, v (B, T, A), state (num, den, max) (B, A) each or
    None, real (B, T, 1) 1 at real tokens or None -> (wkv (B, T, A), (num, den, max) after the last
    token), in float32 or wider. ``chunk``: L, a power of two (shortened to T's next power of two)."""
    batch, length, width = k.shape
    chunk = min(chunk, 1 << (length - 1).bit_length())
    m, a, b = k, v, torch.ones_like(k)  # a token alone: num = v·e^k, den = e^k
    count = k.new_ones(batch, length, 1) if real is None else real.to(k.dtype)
    if real is not None:  # a padded token is the empty triple
        m = torch.where(real > 0, m, EMPTY)
        a, b = a * real, b * real
    m, a, b = _blocks(m, chunk, EMPTY), _blocks(a, chunk, 0.0), _blocks(b, chunk, 0.0)
    count = _blocks(count, chunk, 0.0).cumsum(2)                       # real tokens so far in the chunk
    m, a, b = _within_chunks(m, a, b, count, w)
    if state is None:
        carry = (k.new_full((batch, width), EMPTY), k.new_zeros(batch, width), k.new_zeros(batch, width))
    else:
        carry = (state[2].to(k.dtype), state[0].to(k.dtype), state[1].to(k.dtype))
    starts = []
    # One unbind, not a slice per chunk: the backward of x[:, n] writes a zero gradient of the
    # whole length for every chunk, an unbind's backward stacks once.
    for end_m, end_a, end_b, end_n in zip(m[:, :, -1].unbind(1), a[:, :, -1].unbind(1), b[:, :, -1].unbind(1),
                                          count[:, :, -1].unbind(1)):
        starts.append(carry)
        carry = combine(carry, (end_m, end_a, end_b), w * end_n)
    start = tuple(torch.stack(t, 1)[:, :, None] for t in zip(*starts))  # the state before each chunk
    before = tuple(torch.cat([torch.full_like(t[:, :, :1], fill), t[:, :, :-1]], 2)  # each token's: shifted
                   for t, fill in ((m, EMPTY), (a, 0.0), (b, 0.0)))
    seen = torch.cat([torch.zeros_like(count[:, :, :1]), count[:, :, :-1]], 2)
    m, a, b = (t.flatten(1, 2)[:, :length] for t in combine(start, before, w * seen))
    return bonus_read(m, a, b, u, k, v), (carry[1], carry[2], carry[0])


def bonus_read(m: Tensor, a: Tensor, b: Tensor, u: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """wkv_t from the state before token t, (m, a, b), and the token itself weighted by e^{u + k}."""
    scale = torch.maximum(m, u + k)
    old, new = torch.exp(m - scale), torch.exp(u + k - scale)
    return (old * a + new * v) / (old * b + new)


def wkv_step(w: Tensor, u: Tensor, k: Tensor, v: Tensor, state: Triple) -> tuple[Tensor, Triple]:
    """One token, for decoding: k, v (B, A); state (num, den, max) -> (wkv (B, A), the new state),
    in the state's dtype (transformers' step, as ``seqzoo.reference.rwkv4.wkv4`` writes it)."""
    num, den, top = state
    k, v = k.to(num.dtype), v.to(num.dtype)
    out = bonus_read(top, num, den, u, k, v)
    top, num, den = combine((top, num, den), (k, v, torch.ones_like(k)), w)
    return out, (num, den, top)


@functools.cache
def _fla_kernel():
    """fla's ``fused_recurrent_rwkv4`` (time_decay, time_first, k, v, state (B, 3, 1, A)), or None."""
    try:
        from fla.ops.rwkv4 import fused_recurrent_rwkv4
    except ImportError:
        return None
    return fused_recurrent_rwkv4


def wkv4(time_decay: Tensor, time_first: Tensor, k: Tensor, v: Tensor, state: Triple | None, chunk: int,
         real: Tensor | None = None) -> tuple[Tensor, Triple]:
    """RWKV-4's WKV over k, v (B, T, A) from ``state`` (num, den, max) (B, A) each, float32, or None
    (empty); ``real`` (B, T, 1) marks real tokens (None: all) -> (wkv (B, T, A) float32 or wider,
    the state after the last token). On CUDA with fla installed (and ``SEQZOO_SCAN`` not ``torch``)
    and no padding, fla's fused recurrent kernel, in float32; else one step for a single token with a
    state, the parallel scan otherwise."""
    dtype = torch.promote_types(k.dtype, torch.float32)
    kernel = _fla_kernel() if k.is_cuda and real is None and os.environ.get("SEQZOO_SCAN") != "torch" else None
    with torch.autocast(k.device.type, enabled=False):
        k, v = k.to(dtype), v.to(dtype)
        u, w = time_first.to(dtype), -torch.exp(time_decay.to(dtype))
        if kernel is not None:
            if state is None:
                state = (torch.zeros_like(k[:, 0]), torch.zeros_like(k[:, 0]), torch.full_like(k[:, 0], EMPTY))
            out, final = kernel(time_decay.to(dtype), u, k, v, torch.stack(state, 1)[:, :, None].to(dtype))
            return out, tuple(final[:, :, 0].unbind(1))
        if k.shape[1] == 1 and state is not None:
            out, final = wkv_step(w, u, k[:, 0], v[:, 0], state)
            return out[:, None], final
        return wkv_scan(w, u, k, v, state, chunk, real)
