"""GELU feed-forward (BERT, GPT-2): W₂ · GELU(W₁ x + b₁) + b₂, GELU(x) = x·Φ(x).

``approximate: tanh`` is 0.5x(1 + tanh(√(2/π)(x + 0.044715x³))), GPT-2's "gelu_new".
"""
from __future__ import annotations

from typing import Literal

from seqzoo.plugins.activation.gelu import Gelu
from seqzoo.registry import builtin
from seqzoo.schema import Probability, Size

from ._mlp import MLP


@builtin("two-layer MLP with GELU, exact or tanh (BERT, GPT-2)")
class GeluFFN(MLP):
    """hidden: F (null = 4·C). bias: true. approximate: none (exact erf) or tanh. dropout: 0."""

    def __init__(self, dim: int, hidden: Size | None = None, bias: bool = True,
                 approximate: Literal["none", "tanh"] = "none", dropout: Probability = 0.0) -> None:
        super().__init__(dim, lambda: Gelu(approximate), hidden, bias, dropout)
