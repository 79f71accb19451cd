"""Mamba's selective scan fused into one CPU kernel, forward and backward (numba, an optional extra).

The PyTorch path (``_selective_scan``) is memory-bound: every chunk writes (B, L, E, N) tensors of
decays, inputs and states and reads them back a dozen times. This kernel keeps the state where it
is used instead. A task owns one row and ``CHANNELS`` channels; it holds their (N, CHANNELS) state
in registers and L1 and walks the T tokens once, vectorised over the channels (contiguous in the
(B, T, E) layout), so memory traffic is the inputs and outputs alone. Tasks run in parallel over
rows × channel blocks.

The backward is the reverse scan (mamba_ssm's selective_scan is the reference algorithm). With
g_t = ∂L/∂h_t, taken from the future and from y_t = h_t C_t,

    g_t = ∂L/∂y_t · C_t + a_{t+1} ⊙ g_{t+1},       a_t = exp(Δ_t A)
    ∂Δ_t = Σ_n g_t (A a_t h_{t−1} + u_t B_t),       ∂u_t = Δ_t Σ_n g_t B_t
    ∂B_t = Σ_e g_t Δ_t u_t,   ∂C_t = Σ_e ∂L/∂y_t h_t,   ∂A = Σ_t g_t Δ_t a_t h_{t−1},   ∂h_0 = a_1 ⊙ g_1

It needs h_{t−1} at every step, backwards. The forward saves the state every ``EVERY`` tokens
(B · T/64 · N · E floats, 1/64 of what autograd keeps for the PyTorch path); the backward
recomputes one stretch of 64 states and decays from its saved state and walks it in reverse. ∂B
and ∂C sum over channels, which several tasks share: each task writes its own partial sums and
they are added after the kernel, so no two threads write one value.

exp is written out (``exp_nonpositive``) because numba calls libm's scalar ``expf``, which stops
LLVM from vectorising the loop: 2^(x·log2 e) split into an integer and a fraction, a degree-6
polynomial for 2^fraction (relative error 2e-9 in float64, float32 rounding after) and the integer
put into the exponent bits. Δ ≥ 0 and A ≤ 0, so the argument is never positive; below e^−88 the
result is 0, where float32 turns subnormal.

Compiled at the first call in each process: ~4 s for the forward and ~3 s for the backward on 2 CPU
cores. numba could keep the machine code on disk (``cache=True``), but its cache files are pickles,
and seqzoo unpickles nothing.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic
from torch import Tensor

#: Channels per task: one (N, 32) float32 state is 2 KiB, and the backward's stretch of 64 states
#: and decays 256 KiB, inside a core's L2.
CHANNELS = 32
#: Tokens between the states the forward saves for the backward.
EVERY = 64

_FAST = {"contract", "reassoc", "nsz", "arcp"}  # no "nnan"/"ninf": a NaN input stays a NaN output
_LOG2E = np.float32(1.4426950408889634)
#: 2^f on [0, 1], highest power first: a least-squares fit in relative error on Chebyshev nodes.
_P = tuple(np.float32(c) for c in (2.1690609152316218e-04, 1.2443081514669219e-03, 9.678472553717269e-03,
                                   5.5483524724294075e-02, 2.4022979581420992e-01, 6.931469870574704e-01,
                                   1.0000000018154938))


@intrinsic
def _float_from_bits(typingctx, bits):
    """The float32 whose IEEE-754 bits are ``bits`` (an int32): LLVM's bitcast, which vectorises."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(types.int32), codegen


@njit(inline="always", fastmath=_FAST)
def exp_nonpositive(x):
    """e^x for float32 x ≤ 0, to float32 rounding (0 below e^−88)."""
    z = max(x * _LOG2E, np.float32(-127.0))  # 2^−127 has exponent bits 0: the result is 0
    whole = np.floor(z)
    f = z - whole
    p = ((((((_P[0] * f + _P[1]) * f + _P[2]) * f + _P[3]) * f + _P[4]) * f + _P[5]) * f + _P[6])
    return p * _float_from_bits(np.int32(whole + np.float32(127.0)) << 23)


@njit(nogil=True, fastmath=_FAST, error_model="numpy")
def _forward(tasks, u, dt, A, B, C, h0, y, h_last, saved, every):
    """u, dt, y (R, T, E); A (N, E); B, C (R, T, N); h0, h_last (R, N, E); saved (R, ⌈T/every⌉, N, E)
    receives the state before every ``every``-th token (nothing when every is 0). ``tasks``: the
    range of (row, channel block) tasks to run, row-major."""
    rows, length, width = u.shape
    states = A.shape[0]
    blocks = (width + CHANNELS - 1) // CHANNELS
    for task in range(tasks[0], tasks[1]):
        r, first = task // blocks, (task % blocks) * CHANNELS
        w = min(CHANNELS, width - first)
        h = np.empty((states, CHANNELS), np.float32)
        step = np.empty(CHANNELS, np.float32)
        push = np.empty(CHANNELS, np.float32)
        out = np.empty(CHANNELS, np.float32)
        for n in range(states):
            for j in range(w):
                h[n, j] = h0[r, n, first + j]
        for t in range(length):
            if every > 0 and t % every == 0:
                for n in range(states):
                    for j in range(w):
                        saved[r, t // every, n, first + j] = h[n, j]
            for j in range(w):
                step[j] = dt[r, t, first + j]
                push[j] = step[j] * u[r, t, first + j]
                out[j] = 0.0
            for n in range(states):
                b, c = B[r, t, n], C[r, t, n]
                for j in range(w):
                    value = exp_nonpositive(step[j] * A[n, first + j]) * h[n, j] + push[j] * b
                    h[n, j] = value
                    out[j] += value * c
            for j in range(w):
                y[r, t, first + j] = out[j]
        for n in range(states):
            for j in range(w):
                h_last[r, n, first + j] = h[n, j]


@njit(nogil=True, fastmath=_FAST, error_model="numpy")
def _backward(tasks, u, dt, A, B, C, saved, every, grad_y, grad_last, du, ddt, dA_rows, dB_blocks, dC_blocks,
              dh0):
    """The reverse scan: inputs as in ``_forward`` with ``grad_y`` (R, T, E) and ``grad_last``
    (R, N, E); writes du, ddt (R, T, E), dh0 (R, N, E), ∂A per row dA_rows (R, N, E) and ∂B, ∂C per
    channel block dB_blocks, dC_blocks (R, blocks, T, N), summed by the caller. ``tasks`` as in
    ``_forward``."""
    rows, length, width = u.shape
    states = A.shape[0]
    blocks = (width + CHANNELS - 1) // CHANNELS
    for task in range(tasks[0], tasks[1]):
        r, block = task // blocks, task % blocks
        first = block * CHANNELS
        w = min(CHANNELS, width - first)
        g = np.empty((states, CHANNELS), np.float32)
        dA = np.zeros((states, CHANNELS), np.float32)
        hs = np.empty((every + 1, states, CHANNELS), np.float32)  # hs[k]: the state before token k
        decays = np.empty((every, states, CHANNELS), np.float32)
        step = np.empty(CHANNELS, np.float32)
        push = np.empty(CHANNELS, np.float32)
        dy = np.empty(CHANNELS, np.float32)
        sum_b = np.empty(CHANNELS, np.float32)
        sum_a = np.empty(CHANNELS, np.float32)
        for n in range(states):
            for j in range(w):
                g[n, j] = grad_last[r, n, first + j]
        for stretch in range((length + every - 1) // every - 1, -1, -1):
            start = stretch * every
            stop = min(start + every, length)
            for n in range(states):
                for j in range(w):
                    hs[0, n, j] = saved[r, stretch, n, first + j]
            for t in range(start, stop):  # recompute the stretch's states and decays
                k = t - start
                for j in range(w):
                    step[j] = dt[r, t, first + j]
                    push[j] = step[j] * u[r, t, first + j]
                for n in range(states):
                    b = B[r, t, n]
                    for j in range(w):
                        a = exp_nonpositive(step[j] * A[n, first + j])
                        decays[k, n, j] = a
                        hs[k + 1, n, j] = a * hs[k, n, j] + push[j] * b
            for t in range(stop - 1, start - 1, -1):  # and walk it backwards
                k = t - start
                for j in range(w):
                    step[j] = dt[r, t, first + j]
                    push[j] = step[j] * u[r, t, first + j]
                    dy[j] = grad_y[r, t, first + j]
                    sum_b[j] = 0.0
                    sum_a[j] = 0.0
                for n in range(states):
                    b, c = B[r, t, n], C[r, t, n]
                    grad_b = np.float32(0.0)
                    grad_c = np.float32(0.0)
                    for j in range(w):
                        gv = g[n, j] + dy[j] * c                # ∂L/∂h_t
                        grad_c += dy[j] * hs[k + 1, n, j]
                        grad_b += gv * push[j]
                        through = gv * decays[k, n, j] * hs[k, n, j]
                        sum_a[j] += through * A[n, first + j]
                        sum_b[j] += gv * b
                        dA[n, j] += through * step[j]
                        g[n, j] = gv * decays[k, n, j]          # on to h_{t−1}
                    dB_blocks[r, block, t, n] = grad_b
                    dC_blocks[r, block, t, n] = grad_c
                for j in range(w):
                    ddt[r, t, first + j] = sum_a[j] + sum_b[j] * u[r, t, first + j]
                    du[r, t, first + j] = sum_b[j] * step[j]
        for n in range(states):
            for j in range(w):
                dh0[r, n, first + j] = g[n, j]
                dA_rows[r, n, first + j] = dA[n, j]


_pool: ThreadPoolExecutor | None = None


def _run(kernel, rows: int, width: int, *arrays) -> None:
    """``kernel`` over every (row, channel block) task, split into as many contiguous ranges as
    torch has threads (``--threads``, ``torch.set_num_threads``), one per thread of a pool. The
    kernels release the GIL, so the threads run in parallel; numba's own ``parallel=True`` would do
    the same, but doubles the compile time of a fresh process."""
    global _pool
    tasks = rows * -(-width // CHANNELS)
    cores = os.cpu_count() or 1
    threads = max(1, min(torch.get_num_threads(), tasks, cores))
    bounds = [tasks * i // threads for i in range(threads + 1)]
    if threads == 1:
        kernel((0, tasks), *arrays)
        return
    if _pool is None:
        _pool = ThreadPoolExecutor(cores, thread_name_prefix="seqzoo-scan")
    for done in [_pool.submit(kernel, (bounds[i], bounds[i + 1]), *arrays) for i in range(threads)]:
        done.result()


@torch.library.custom_op("seqzoo::selective_scan", mutates_args=(), device_types="cpu")
def fused_scan(u: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, h0: Tensor,
               every: int) -> tuple[Tensor, Tensor, Tensor]:
    """u, dt (R, T, E), A (N, E), B, C (R, T, N), h0 (R, N, E), all contiguous float32 ->
    (y (R, T, E), h_T (R, N, E), the states saved for the backward (R, ⌈T/every⌉, N, E))."""
    rows, length, width = u.shape
    y, h_last = u.new_empty(rows, length, width), h0.new_empty(h0.shape)
    saved = u.new_empty(rows, -(-length // every) if every else 0, A.shape[0], width)
    _run(_forward, rows, width, u.numpy(), dt.numpy(), A.numpy(), B.numpy(), C.numpy(), h0.numpy(), y.numpy(),
             h_last.numpy(), saved.numpy(), every)
    return y, h_last, saved


@fused_scan.register_fake
def _(u, dt, A, B, C, h0, every):
    rows, length, width = u.shape
    return (u.new_empty(rows, length, width), h0.new_empty(h0.shape),
            u.new_empty(rows, -(-length // every) if every else 0, A.shape[0], width))


@torch.library.custom_op("seqzoo::selective_scan_backward", mutates_args=(), device_types="cpu")
def fused_scan_backward(u: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, saved: Tensor, every: int,
                        grad_y: Tensor, grad_last: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The gradients of ``fused_scan`` -> (∂u, ∂Δ, ∂A, ∂B, ∂C, ∂h0), shaped as its inputs."""
    rows, length, width = u.shape
    states, blocks = A.shape[0], -(-width // CHANNELS)
    du, ddt = torch.empty_like(u), torch.empty_like(u)
    dh0, dA_rows = u.new_empty(rows, states, width), u.new_empty(rows, states, width)
    dB_blocks, dC_blocks = (u.new_empty(rows, blocks, length, states) for _ in range(2))
    _run(_backward, rows, width, u.numpy(), dt.numpy(), A.numpy(), B.numpy(), C.numpy(), saved.numpy(), every,
              grad_y.numpy(), grad_last.numpy(), du.numpy(), ddt.numpy(), dA_rows.numpy(),
              dB_blocks.numpy(), dC_blocks.numpy(), dh0.numpy())
    return du, ddt, dA_rows.sum(0), dB_blocks.sum(1), dC_blocks.sum(1), dh0


@fused_scan_backward.register_fake
def _(u, dt, A, B, C, saved, every, grad_y, grad_last):
    return (torch.empty_like(u), torch.empty_like(u), A.new_empty(A.shape), B.new_empty(B.shape),
            C.new_empty(C.shape), u.new_empty(u.shape[0], A.shape[0], u.shape[2]))


def _setup(ctx, inputs, output) -> None:
    u, dt, A, B, C, _, every = inputs
    ctx.save_for_backward(u, dt, A, B, C, output[2])
    ctx.every = every


def _gradients(ctx, grad_y, grad_last, _grad_saved):
    u, dt, A, B, C, saved = ctx.saved_tensors
    grad_y = torch.zeros_like(u) if grad_y is None else grad_y.contiguous()
    grad_last = u.new_zeros(u.shape[0], A.shape[0], u.shape[2]) if grad_last is None else grad_last.contiguous()
    return *fused_scan_backward(u, dt, A, B, C, saved, ctx.every, grad_y, grad_last), None


fused_scan.register_autograd(_gradients, setup_context=_setup)


def selective_scan(u: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor,
                   h: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``_selective_scan.selective_scan`` on the fused kernel: u, dt (B, T, D); A (D, N); B, C
    (B, T, N); h (B, D, N) or None -> (y (B, T, D) float32, h_T (B, D, N) float32)."""
    batch, length, channels = u.shape
    f32 = [t.to(torch.float32).contiguous() for t in (u, dt, B, C)]
    start = (u.new_zeros(batch, A.shape[1], channels, dtype=torch.float32) if h is None
             else h.to(torch.float32).transpose(1, 2).contiguous())
    A_t = A.to(torch.float32).t().contiguous()
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (u, dt, A, B, C, start))
    y, last, _ = fused_scan(f32[0], f32[1], A_t, f32[2], f32[3], start, EVERY if grad else 0)
    return y, last.transpose(1, 2)
