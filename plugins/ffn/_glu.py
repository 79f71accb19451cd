"""The gated feed-forward shared by the GLU variants (Shazeer, 2020, "GLU Variants Improve
Transformer"): FFN(x) = W₂ (act(W₁ x) ⊙ W₃ x), no biases by default.

W₁ is ``gate`` (the activated branch; HF LLaMA ``gate_proj``), W₃ is ``up`` (the linear branch;
``up_proj``), W₂ is ``down`` (``down_proj``, which writes into the residual stream). With no
``hidden`` the width follows LLaMA: F = int(2·4C/3) keeps the parameter count near a 4C ungated
MLP's 8C²; LLaMA-3 then scales by ``ffn_dim_multiplier``; the result is rounded up to
``multiple_of``.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from torch import Tensor, nn

from seqzoo.errors import ConfigError
from seqzoo.interfaces import FeedForward
from seqzoo.nn.linear import Linear


def llama_hidden(dim: int, multiple_of: int = 1, ffn_dim_multiplier: float | None = None) -> int:
    """LLaMA's gated width: h = int(2·4C/3); h = int(mult·h) if a multiplier is given; round h up
    to a multiple of ``multiple_of``. (4096, 256) -> 11008; (4096, 1024, 1.3) -> 14336."""
    hidden = 2 * (4 * dim) // 3  # int() of a positive quotient, without float rounding
    if ffn_dim_multiplier is not None:
        hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * -(-hidden // multiple_of)


class GLU(FeedForward):
    """activation: a factory of the gate branch's activation (``() -> nn.Module``; a registered
    variant's recipe names it). hidden: F (null = LLaMA's rule, see ``llama_hidden``).
    multiple_of: round the derived F up to a multiple of this (1; LLaMA 256). ffn_dim_multiplier:
    scale the derived F before rounding (null; LLaMA-3 1.3). bias: on all three projections
    (false). dropout: on the gated product, before ``down``, while training (0).

    An explicit ``hidden`` is used as it is: it must be a multiple of ``multiple_of`` and cannot be
    combined with ``ffn_dim_multiplier``.
    """

    residual_projections = ("down",)

    #: The registry name, for error messages.
    variant: ClassVar[str] = "glu"

    def __init__(self, dim: int, activation: Callable[[], nn.Module], hidden: int | None = None,
                 multiple_of: int = 1, ffn_dim_multiplier: float | None = None, bias: bool = False,
                 dropout: float = 0.0) -> None:
        super().__init__(dim)
        if hidden is None:
            hidden = llama_hidden(dim, multiple_of, ffn_dim_multiplier)
        elif ffn_dim_multiplier is not None:
            raise ConfigError(
                f"{self.variant}: ffn_dim_multiplier={ffn_dim_multiplier} only scales the derived "
                f"width, but hidden={hidden} is set; drop one of them")
        elif hidden % multiple_of:
            rounded = multiple_of * -(-hidden // multiple_of)
            raise ConfigError(
                f"{self.variant}: hidden={hidden} must be a multiple of multiple_of={multiple_of}; "
                f"use hidden={rounded}, or hidden: null to derive it")
        self.hidden = hidden
        self.gate = Linear(dim, hidden, bias=bias)
        self.up = Linear(dim, hidden, bias=bias)
        self.down = Linear(hidden, dim, bias=bias)
        self.activation = activation()
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, T, C) -> (B, T, C) through two (B, T, F) branches."""
        return self.down(self.dropout(self.activation(self.gate(x)) * self.up(x)))
