"""GELU (Hendrycks & Gimpel, 2016): gelu(x) = x·Φ(x) = 0.5x(1 + erf(x/√2)), elementwise.

``approximate: tanh`` is 0.5x(1 + tanh(√(2/π)(x + 0.044715x³))): GPT-2's "gelu_new", Gemma's
"gelu_pytorch_tanh". The two differ by < 1e-3 — enough to break parity with a checkpoint trained on
the other one.
"""
from __future__ import annotations

from typing import Literal

import torch.nn.functional as F
from torch import Tensor

from seqzoo.interfaces import Activation
from seqzoo.registry import builtin


@builtin("x·Φ(x), exact erf or tanh approximation (BERT, GPT-2)")
class Gelu(Activation):
    """approximate: none (exact, erf; BERT, PyTorch's default) or tanh (GPT-2). Default none."""

    def __init__(self, approximate: Literal["none", "tanh"] = "none") -> None:
        super().__init__()
        self.approximate = approximate

    def forward(self, x: Tensor) -> Tensor:
        """x (...) -> (...)."""
        return F.gelu(x, approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"
