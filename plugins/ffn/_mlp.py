"""The two-layer position-wise MLP shared by the ungated FFN variants: W₂ · act(W₁ x + b₁) + b₂.

The activation is a registered ``activation`` component, named in the recipe or fixed by the
variant (``gelu``, ``relu``), so any activation plugin works in any MLP.
"""
from __future__ import annotations

from torch import Tensor, nn

import seqzoo
from seqzoo.interfaces import FeedForward
from seqzoo.nn.linear import Linear
from seqzoo.schema import Spec


class MLP(FeedForward):
    """activation: an ``activation`` component, by name or ``{kind: NAME, **params}``. hidden: F,
    the inner width (null = 4·C). bias: biases on both layers. dropout: after the activation while
    training.

    Submodules ``up`` (C -> F) and ``down`` (F -> C); ``down`` writes into the residual stream.
    """

    def __init__(self, dim: int, activation: Spec["activation"], hidden: int | None = None,  # noqa: F821
                 bias: bool = True, dropout: float = 0.0) -> None:
        super().__init__(dim)
        self.hidden = hidden or 4 * dim
        self.up = Linear(dim, self.hidden, bias=bias)
        self.down = Linear(self.hidden, dim, bias=bias)
        self.activation = seqzoo.registry().create("activation", activation)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, T, C) -> (B, T, C) through (B, T, F)."""
        return self.down(self.dropout(self.activation(self.up(x))))
