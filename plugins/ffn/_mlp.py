"""The two-layer position-wise MLP shared by the ungated FFN variants: W₂ · act(W₁ x + b₁) + b₂.

The activation comes as a factory: the registry's for the component a recipe names (``mlp``), or
the variant's own fixed one (``gelu``, ``relu``), so any activation plugin works in any MLP and a
test can hand it a plain module.
"""
from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

from seqzoo.interfaces import FeedForward
from seqzoo.nn.linear import Linear


class MLP(FeedForward):
    """activation: a factory of the activation module (``() -> nn.Module``). hidden: F,
    the inner width (null = 4·C). bias: biases on both layers. dropout: after the activation while
    training.

    Submodules ``up`` (C -> F) and ``down`` (F -> C); ``down`` writes into the residual stream.
    """

    residual_projections = ("down",)

    def __init__(self, dim: int, activation: Callable[[], nn.Module], hidden: int | None = None,
                 bias: bool = True, dropout: float = 0.0) -> None:
        super().__init__(dim)
        self.hidden = hidden or 4 * dim
        self.up = Linear(dim, self.hidden, bias=bias)
        self.down = Linear(self.hidden, dim, bias=bias)
        self.activation = activation()
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, T, C) -> (B, T, C) through (B, T, F)."""
        return self.down(self.dropout(self.activation(self.up(x))))
