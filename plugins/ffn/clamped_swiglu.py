"""gpt-oss's clamped SwiGLU (OpenAI, 2025), the FFN of its experts:

    g = min(W₁x + b₁, L),  u = clamp(W₃x + b₃, −L, L)
    FFN(x) = W₂ ((u + 1) · g·σ(α g)) + b₂

α = 1.702 makes g·σ(αg) the sigmoid approximation of GELU; the clamps (L = 7) bound the
activations of the largest experts, the gate from above only; the + 1 lets the linear branch pass
its input through where the gate is open. ``gate`` / ``up`` / ``down`` are W₁ / W₃ / W₂ as in every
gated FFN here (gpt-oss stores gate and up interleaved in one tensor; its converter splits them).
"""
from __future__ import annotations

import torch
from torch import Tensor

from seqzoo.interfaces import FeedForward
from seqzoo.nn.linear import Linear
from seqzoo.registry import builtin
from seqzoo.schema import PositiveFloat, Size


@builtin("gpt-oss's SwiGLU: clamped gate and input, (u + 1)·g·σ(αg), biases")
class ClampedSwiGLU(FeedForward):
    """hidden: F (required). alpha: α (1.702). limit: L (7.0). bias: on all three projections
    (true)."""

    residual_projections = ("down",)

    recipe_example = """
        seqzoo: 1
        extends: tiny-llama
        model:
          ffn: {kind: moe, experts: 4, top_k: 2, router: {kind: topk_softmax, bias: true},
                expert: {kind: clamped_swiglu, hidden: 64, alpha: 1.702, limit: 7.0}}
        """
    example_params = {"hidden": 16}

    def __init__(self, dim: int, hidden: Size, alpha: PositiveFloat = 1.702, limit: PositiveFloat = 7.0,
                 bias: bool = True) -> None:
        super().__init__(dim)
        self.hidden, self.alpha, self.limit = hidden, alpha, limit
        self.gate = Linear(dim, hidden, bias=bias)
        self.up = Linear(dim, hidden, bias=bias)
        self.down = Linear(hidden, dim, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, T, C) -> (B, T, C) through two (B, T, F) branches."""
        gate = self.gate(x).clamp(max=self.limit)
        up = self.up(x).clamp(-self.limit, self.limit)
        return self.down((up + 1) * gate * torch.sigmoid(self.alpha * gate))

    def extra_repr(self) -> str:
        return f"hidden={self.hidden}, alpha={self.alpha}, limit={self.limit}"
