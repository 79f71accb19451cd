"""ReLU feed-forward (Vaswani et al., 2017): W₂ · max(0, W₁ x + b₁) + b₂, F = 4·C by default."""
from __future__ import annotations

from seqzoo.plugins.activation.relu import Relu
from seqzoo.registry import builtin
from seqzoo.schema import Probability, Size

from ._mlp import MLP


@builtin("two-layer MLP with ReLU (Vaswani 2017, T5 v1.0)")
class ReluFFN(MLP):
    """hidden: F (null = 4·C). bias: true (T5 v1.0: false). dropout: 0."""

    def __init__(self, dim: int, hidden: Size | None = None, bias: bool = True,
                 dropout: Probability = 0.0) -> None:
        super().__init__(dim, Relu, hidden, bias, dropout)
