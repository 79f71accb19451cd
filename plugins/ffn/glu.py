"""Generic gated feed-forward (Shazeer, 2020): FFN(x) = W₂ (act(W₁ x) ⊙ W₃ x) with any registered
activation on the gate branch W₁.

The default, sigmoid, is the paper's FFN_GLU (Dauphin et al., 2017's GLU); ``activation: relu``
is ReGLU, ``gelu`` GEGLU, ``silu`` SwiGLU (the last two also have their own names).
"""
from __future__ import annotations

from seqzoo.registry import builtin
from seqzoo.schema import PositiveFloat, PositiveInt, Probability, Size, Spec

from ._glu import GLU


@builtin("gated FFN with any gate activation (Shazeer 2020)")
class GluFFN(GLU):
    """hidden: F (null = int(2·4C/3), scaled by ffn_dim_multiplier, rounded up to multiple_of).
    activation: the gate's ``activation`` component, by name or ``{kind: NAME, **params}``
    (sigmoid). multiple_of: 1. ffn_dim_multiplier: null. bias: false. dropout: 0."""

    variant = "glu"

    def __init__(self, dim: int, hidden: Size | None = None,
                 activation: Spec["activation"] = "sigmoid", multiple_of: PositiveInt = 1,  # noqa: F821
                 ffn_dim_multiplier: PositiveFloat | None = None, bias: bool = False,
                 dropout: Probability = 0.0) -> None:
        super().__init__(dim, activation, hidden, multiple_of, ffn_dim_multiplier, bias, dropout)
