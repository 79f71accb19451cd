"""``nn.Linear`` with a fast path for the few-row products of token-by-token decoding on a CPU.

Decoding one token per sequence multiplies every weight matrix by 1–16 rows: the step is bound by
reading the weights, and how fast they stream depends on how the product is handed to the BLAS
and on the CPU. On AMD EPYC cores (MKL), ``x @ Wᵀ`` with few rows read W at 10–20 GB/s and the
same numbers as ``(W @ xᵀ)ᵀ`` — the weight as the tall left operand — ran about 2× faster, a
single row fastest duplicated into two. On Intel Xeon cores it is the other way round: with the
weights out of cache, ``F.linear`` took 51 µs for one row of a 1024×256 weight where the
transposed product took 128 µs (84 against 235 µs at 768×768; equal at 8 rows), and a Mixtral-
shaped model decoded 1.45–1.6× faster without it. So the path is taken on AMD CPUs only
(``WEIGHT_STREAMING``); training, prefill and other devices keep ``F.linear``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

#: Products with at most this many rows take the weight-streaming path.
FEW_ROWS = 16


def _amd_cpu() -> bool:
    """Whether this process runs on AMD cores (Linux's /proc/cpuinfo; False where unreadable)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as info:
            return any(line.startswith("vendor_id") and "AuthenticAMD" in line for line in info)
    except OSError:
        return False


#: Whether the few-row products take ``few_rows_linear`` on this machine (see the module docstring).
WEIGHT_STREAMING = _amd_cpu()


def few_rows_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``F.linear(x, weight, bias)`` for x (..., C_in) holding at most ``FEW_ROWS`` rows, computed
    as (W @ xᵀ)ᵀ -> (..., C_out), contiguous."""
    rows = x.reshape(-1, x.shape[-1])
    n = rows.shape[0]
    if n == 1:
        rows = torch.cat([rows, rows])
    # rows.t() must stay a transposed view: a contiguous (C_in, n) copy is the slow case again.
    out = torch.mm(weight, rows.t()) if bias is None else torch.addmm(bias[:, None], weight, rows.t())
    return out[:, :n].t().contiguous().view(*x.shape[:-1], weight.shape[0])


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear``, through ``few_rows_linear`` for float32 CPU inputs of at most ``FEW_ROWS``
    rows when no gradient is being recorded and ``WEIGHT_STREAMING`` (a slice of a stacked weight
    too)."""
    if (WEIGHT_STREAMING and x.device.type == "cpu" and x.dtype == torch.float32
            and weight.dtype == torch.float32 and type(weight.data) is Tensor  # not a quantized subclass
            and 0 < x.numel() <= FEW_ROWS * x.shape[-1]
            and not torch.is_grad_enabled()):
        return few_rows_linear(x, weight, bias)
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, same state dict) whose forward is ``linear``: the few-row
    path for float32 CPU decoding, ``F.linear`` otherwise."""

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias)
