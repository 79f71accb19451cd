"""AdamW (Loshchilov & Hutter, 2019, "Decoupled Weight Decay Regularization"): Adam's update with
the weight decay applied to the weights themselves, not added to the gradient:

    m ← β₁·m + (1 − β₁)·g,   v ← β₂·v + (1 − β₂)·g²,   θ ← θ·(1 − lr·λ) − lr · m̂ / (√v̂ + ε)

with m̂ = m / (1 − β₁ᵗ), v̂ = v / (1 − β₂ᵗ): ``torch.optim.AdamW``, fused on the CPU and CUDA. The
default optimizer; λ (``train.weight_decay``) applies to weight matrices only.
"""
from __future__ import annotations

import torch

from seqzoo.interfaces import TrainedParameters, UpdateRule
from seqzoo.registry import builtin
from seqzoo.schema import PositiveFloat

from ._adam import adamw


@builtin("Adam with decoupled weight decay (torch.optim.AdamW, fused); the default")
class AdamW(UpdateRule):
    """eps: ε in the denominator (1e-8, torch's; the Transformer used 1e-9). β₁, β₂ and λ are the
    ``train:`` section's ``beta1``, ``beta2`` and ``weight_decay``."""

    def __init__(self, eps: PositiveFloat = 1e-8) -> None:
        self.eps = eps

    def build(self, params: TrainedParameters, *, lr: float, weight_decay: float,
              betas: tuple[float, float]) -> torch.optim.Optimizer:
        return adamw(params.groups(weight_decay), lr=lr, betas=betas, eps=self.eps)
