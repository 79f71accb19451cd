"""SwiGLU feed-forward (Shazeer, 2020; LLaMA, Touvron et al., 2023; Mistral):
FFN(x) = W₂ (SiLU(W₁ x) ⊙ W₃ x), SiLU(x) = x·σ(x).

Submodules match HF LLaMA: ``gate`` = ``gate_proj`` = W₁ (activated), ``up`` = ``up_proj`` = W₃,
``down`` = ``down_proj`` = W₂. Width with hidden: null: int(2·4C/3), × ffn_dim_multiplier,
rounded up to multiple_of — LLaMA-7B (4096, 256) -> 11008; LLaMA-3-8B (4096, 1024, 1.3) -> 14336.
"""
from __future__ import annotations

from seqzoo.plugins.activation.silu import Silu
from seqzoo.registry import builtin
from seqzoo.schema import PositiveFloat, PositiveInt, Probability, Size

from ._glu import GLU


@builtin("gated FFN with a SiLU gate (LLaMA, Mistral)")
class SwiGLU(GLU):
    """hidden: F (null = LLaMA's rule). multiple_of: round the derived F up to it (1; LLaMA 256).
    ffn_dim_multiplier: scale the derived F first (null; LLaMA-3 1.3). bias: false. dropout: 0."""

    variant = "swiglu"

    def __init__(self, dim: int, hidden: Size | None = None, multiple_of: PositiveInt = 1,
                 ffn_dim_multiplier: PositiveFloat | None = None, bias: bool = False,
                 dropout: Probability = 0.0) -> None:
        super().__init__(dim, Silu, hidden, multiple_of, ffn_dim_multiplier, bias, dropout)
