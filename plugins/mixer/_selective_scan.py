"""The selective scan of Mamba (Gu & Dao, 2023) in plain PyTorch: a diagonal linear recurrence whose
decay and input both depend on the token,

    h_t = exp(Δ_t A) ⊙ h_{t−1} + Δ_t B_t u_t,    y_t = h_t C_t

with u, Δ (B, T, D), A (D, N) negative, B_t, C_t (B, T, N) shared by the D channels, and a state
h (B, D, N). Each (channel, state) pair decays at its own rate, so — unlike Mamba-2's scalar decay
per head — the scan cannot be turned into one matrix product; it is run chunk by chunk instead.

Inside a chunk of L tokens the recurrence unrolls to a cumulative sum. With S_t = A·Σ_{s≤t} Δ_s
(the log-decay from the chunk start, ≤ 0):

    h_t = exp(S_t) ⊙ (h_0 + Σ_{s≤t} exp(−S_s) ⊙ Δ_s B_s u_s)

— one ``cumsum`` over the chunk instead of L dependent steps. exp(−S_s) grows as the chunk decays,
so the chunk length is chosen per call to keep |S| ≤ ``LOG_DECAY_LIMIT`` (40) in every chunk. The
bound is set by the backward pass, not the forward: exp(−S) is its own factor here (a division by
exp(S) would have the gradient −x / exp(S)², which overflows float32 once |S| > 44), and its
gradient carries e^|S| times the upstream one, so 40 leaves ~10²¹ of float32's range for the
values and the sum over the chunk. Chunks run in a Python loop (T / L of them, not T), each on
(B, L, D, N) tensors small enough to stay in cache.

On the CPU ``selective_scan`` runs the fused kernel of ``_fused_scan`` instead when numba is
installed (``pip install 'seqzoo[fast]'``): the same function, 5-10× faster forward and backward.
Without numba it says so once and runs the chunked path; ``SEQZOO_SCAN=torch`` asks for the chunked
path on purpose. float64 (the tests' references) and CUDA tensors always take the chunked path.
"""
from __future__ import annotations

import os
import warnings

import torch
from torch import Tensor

from seqzoo.errors import PerformanceWarning

#: Elements of one chunk's (B, L, D, N) tensors: 2 MiB of float32, which a core's cache holds
#: while the chunk's dozen elementwise passes run (measured on 2 CPU cores: at B = 8, D = 512,
#: N = 16, chunks of 8 tokens ran the training scan 1.4× faster than chunks of 16; at B = 1,
#: D = 256, chunks of 32 ran 1.6× faster than chunks of 8).
WORKING_SET = 1 << 19
#: The largest |log-decay| allowed inside one chunk: e^±40 and their gradients (e^40 times the
#: upstream ones) stay far inside float32's range (3.4e38 = e^88.7).
LOG_DECAY_LIMIT = 40.0


def chunk_length(dt: Tensor, A: Tensor, longest: int) -> int:
    """The longest power-of-two chunk ≤ ``longest`` over which no (row, channel, state) decays by
    more than e^−40: max over chunks of Σ Δ · max|A| of the channel. dt (B, T, D) ≥ 0, A (D, N).
    Decays that steep are rare (trained Mamba has Δ·|A| ~ 0.01–10 per step); L = 1 always works."""
    rate = A.abs().amax(-1)  # (D,) the fastest decay of each channel
    length = longest
    while length > 1:
        pad = -dt.shape[1] % length
        padded = torch.nn.functional.pad(dt, (0, 0, 0, pad))  # zeros: no decay
        per_chunk = padded.unflatten(1, (-1, length)).sum(2)  # (B, T/L, D)
        if float((per_chunk * rate).amax()) <= LOG_DECAY_LIMIT:
            return length
        length //= 2
    return 1


_fused = None  # the fused kernel's module once imported, False when numba is missing


def fused_kernel():
    """``_fused_scan`` if numba imports, else None (after a one-line notice, once per process)."""
    global _fused
    if _fused is None:
        try:
            from . import _fused_scan
            _fused = _fused_scan
        except ImportError as error:
            _fused = False
            warnings.warn(f"Mamba's selective scan runs its PyTorch path, several times slower on the CPU "
                          f"({error.name or error}: not installed); pip install 'seqzoo[fast]' for the fused kernel",
                          PerformanceWarning, stacklevel=2)
    return _fused or None


def selective_scan(u: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, h: Tensor | None = None,
                   chunk: int = 64) -> tuple[Tensor, Tensor]:
    """y_t = h_t C_t for the recurrence above -> (y (B, T, D), final state h_T (B, D, N)): the fused
    CPU kernel where it applies (see the module's notes), else ``chunked_scan``."""
    wanted = (u.device.type == "cpu" and u.dtype != torch.float64 and u.shape[1] > 0
              and os.environ.get("SEQZOO_SCAN", "fused") != "torch")
    kernel = fused_kernel() if wanted else None
    if kernel is not None:
        return kernel.selective_scan(u, dt, A, B, C, h)
    return chunked_scan(u, dt, A, B, C, h, chunk)


def chunked_scan(u: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, h: Tensor | None = None,
                 chunk: int = 64) -> tuple[Tensor, Tensor]:
    """y_t = h_t C_t for the recurrence above -> (y (B, T, D), final state h_T (B, D, N)), chunk by
    chunk in PyTorch.

    u, dt (B, T, D); A (D, N) ≤ 0; B, C (B, T, N); h (B, D, N) the state before the first token
    (zeros if None). A token with Δ = 0 leaves the state as it was (padding). Computed in float32
    or wider; ``chunk``: the longest chunk tried (64), shortened to fit ``WORKING_SET`` and the
    log-decay limit.
    """
    batch, length, channels = u.shape
    dtype = torch.promote_types(u.dtype, torch.float32)
    u, dt, A, B, C = (t.to(dtype) for t in (u, dt, A, B, C))
    h = u.new_zeros(batch, channels, A.shape[1]) if h is None else h.to(dtype)
    fits = max(1, WORKING_SET // (batch * channels * A.shape[1]))
    longest = min(chunk, 1 << (fits.bit_length() - 1))  # a power of two whose chunk stays in cache
    step = chunk_length(dt.detach(), A.detach(), longest)
    outputs = []
    # One split, not a slice per chunk: the backward of u[:, a:b] writes a zero gradient of the
    # whole length T for every chunk (T²/L work), a split's backward concatenates once.
    for u_c, dt_c, B_c, C_c in zip(*(t.split(step, dim=1) for t in (u, dt, B, C))):
        inputs = (dt_c * u_c)[..., None] * B_c[:, :, None, :]                 # Δ_s B_s u_s (B, L, D, N)
        if step == 1:  # one token: the recurrence itself
            states = torch.exp(dt_c[..., None] * A) * h[:, None] + inputs
        else:
            log_decay = dt_c.cumsum(1)[..., None] * A                         # S_t (B, L, D, N)
            growth = (-log_decay).exp()                                       # exp(−S_s), no division
            states = log_decay.exp() * (h[:, None] + (inputs * growth).cumsum(1))  # h_t (B, L, D, N)
        outputs.append(torch.einsum("bldn,bln->bld", states, C_c))
        h = states[:, -1]
    return torch.cat(outputs, 1), h


def selective_step(u: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
    """One token of the recurrence, for decoding: u, dt (B, D); B, C (B, N); h (B, D, N) ->
    (y (B, D), new h). Constant time and memory whatever came before."""
    dtype = h.dtype
    u, dt, A, B, C = (t.to(dtype) for t in (u, dt, A, B, C))
    h = torch.exp(dt[..., None] * A) * h + (dt * u)[..., None] * B[:, None]
    return torch.einsum("bdn,bn->bd", h, C), h
