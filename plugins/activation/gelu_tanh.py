"""GELU, tanh approximation (Hendrycks & Gimpel, 2016): gelu(x) ≈ 0.5x(1 + tanh(√(2/π)(x + 0.044715x³))).

A name for ``{kind: gelu, approximate: tanh}``, as HF names it ``gelu_new`` / ``gelu_pytorch_tanh``
(GPT-2, GPT-J, BLOOM, Gemma, T5 v1.1 gated-gelu).
"""
from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from seqzoo.interfaces import Activation
from seqzoo.registry import builtin


@builtin("GELU, tanh approximation (GPT-2 gelu_new, Gemma)")
class GeluTanh(Activation):
    """No recipe params: always the tanh approximation."""

    def forward(self, x: Tensor) -> Tensor:
        """x (...) -> (...)."""
        return F.gelu(x, approximate="tanh")
