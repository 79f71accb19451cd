"""``nn.Linear`` with a fast path for the few-row products of token-by-token decoding on a CPU.

Decoding one token per sequence multiplies every weight matrix by 1–16 rows: the step is bound by
reading the weights, and how fast they stream depends on how the product is handed to the BLAS.
On this project's CPUs (MKL), ``x @ Wᵀ`` with few rows reads W at 10–20 GB/s; the same numbers as
``(W @ xᵀ)ᵀ`` — the weight as the tall left operand — run about 2× faster, and a single row runs
fastest duplicated into two (one row takes MKL's slower matrix–vector path). Measured in
docs/performance.md. Training, prefill and other devices keep ``F.linear``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

#: Products with at most this many rows take the weight-streaming path.
FEW_ROWS = 16


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
    rows when no gradient is being recorded (a weight that is a slice of a stacked tensor too)."""
    if (x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype == torch.float32
            and 0 < x.numel() <= FEW_ROWS * x.shape[-1] and not torch.is_grad_enabled()):
        return few_rows_linear(x, weight, bias)
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, same state dict) whose forward is ``linear``: the few-row
    path for float32 CPU decoding, ``F.linear`` otherwise."""

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias)
