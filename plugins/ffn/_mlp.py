"""The two-layer position-wise MLP shared by the ungated FFN variants: W₂ · act(W₁ x + b₁) + b₂."""
from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

from seqzoo.interfaces import FeedForward


class MLP(FeedForward):
    """hidden: F, the inner width (null = 4·C). bias: biases on both layers. dropout: after the
    activation while training."""

    def __init__(self, dim: int, activation: Callable[[Tensor], Tensor], hidden: int | None = None,
                 bias: bool = True, dropout: float = 0.0) -> None:
        super().__init__(dim)
        self.hidden = hidden or 4 * dim
        self.up = nn.Linear(dim, self.hidden, bias=bias)
        self.down = nn.Linear(self.hidden, dim, bias=bias)
        self.activation = activation
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, T, C) -> (B, T, C) through (B, T, F)."""
        return self.down(self.dropout(self.activation(self.up(x))))
