"""GEGLU feed-forward (Shazeer, 2020; T5 v1.1 / Flan-T5 "gated-gelu", Gemma):
FFN(x) = W₂ (GELU(W₁ x) ⊙ W₃ x), GELU exact (x·Φ(x)) or tanh-approximated.

T5 v1.1 and Gemma use the tanh approximation (``approximate: tanh``); the two differ enough to
break checkpoint parity. Submodules ``gate`` (W₁, activated; T5 ``wi_0``), ``up`` (W₃; ``wi_1``),
``down`` (W₂; ``wo``).
"""
from __future__ import annotations

from typing import Literal

from seqzoo.plugins.activation.gelu import Gelu
from seqzoo.registry import builtin
from seqzoo.schema import PositiveFloat, PositiveInt, Probability, Size

from ._glu import GLU


@builtin("gated FFN with a GELU gate (T5 v1.1, Gemma)")
class GeGLU(GLU):
    """hidden: F (null = int(2·4C/3), scaled by ffn_dim_multiplier, rounded up to multiple_of).
    multiple_of: 1. ffn_dim_multiplier: null. bias: false. approximate: none (exact erf) or tanh
    (T5 v1.1, Gemma); none. dropout: 0."""

    variant = "geglu"

    def __init__(self, dim: int, hidden: Size | None = None, multiple_of: PositiveInt = 1,
                 ffn_dim_multiplier: PositiveFloat | None = None, bias: bool = False,
                 approximate: Literal["none", "tanh"] = "none", dropout: Probability = 0.0) -> None:
        super().__init__(dim, lambda: Gelu(approximate), hidden, multiple_of,
                         ffn_dim_multiplier, bias, dropout)
