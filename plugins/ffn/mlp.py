"""Generic two-layer feed-forward (Vaswani et al., 2017) with any registered activation:
FFN(x) = W₂ · act(W₁ x + b₁) + b₂.

``{kind: mlp, activation: quick_gelu}`` is CLIP's MLP; ``activation: relu`` is the ``relu`` FFN.
"""
from __future__ import annotations

from seqzoo.registry import builtin
from seqzoo.schema import Probability, Size, Spec

from ._mlp import MLP


@builtin("two-layer MLP with any activation component (CLIP, ViT)")
class MlpFFN(MLP):
    """hidden: F (null = 4·C). activation: an ``activation`` component by name or
    ``{kind: NAME, **params}`` (gelu). bias: on both layers (true). dropout: after the activation
    while training (0)."""

    def __init__(self, dim: int, hidden: Size | None = None,
                 activation: Spec["activation"] = "gelu", bias: bool = True,  # noqa: F821
                 dropout: Probability = 0.0) -> None:
        super().__init__(dim, activation, hidden, bias, dropout)
