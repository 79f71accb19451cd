"""Adafactor (Shazeer & Stern, 2018, "Adafactor: Adaptive Learning Rates with Sublinear Memory
Cost"), ``torch.optim.Adafactor``: Adam's second moment of an (R, C) matrix kept as its row and
column means, R + C numbers instead of R·C, and no first moment:

    r ← r + (1 − β₂ₜ)·(mean_j g² − r),   c ← c + (1 − β₂ₜ)·(mean_i g² − c),   v̂ = r·cᵀ / mean(r)
    u = g / √v̂,   θ ← θ·(1 − lr·λ) − ρₜ · max(ε₂, RMS(θ)) · u / max(1, RMS(u) / d)

with 1 − β₂ₜ = t^beta2_decay and ρₜ = min(lr, 1/√t): the step is relative to the parameter's own
scale, so ``train.lr`` is the cap on that relative step (torch's default is 1e-2), not an absolute
rate as for AdamW. Vectors keep an unfactored v.
"""
from __future__ import annotations

from typing import Annotated

import torch

from seqzoo.interfaces import TrainedParameters, UpdateRule
from seqzoo.registry import builtin
from seqzoo.schema import PositiveFloat, Range


@builtin("factored second moments, relative step size (torch.optim.Adafactor)")
class Adafactor(UpdateRule):
    """beta2_decay: the exponent of 1 − β₂ₜ = t^beta2_decay (−0.8). eps: ε₂, the smallest parameter
    RMS the relative step is taken of (1e-3); ε₁, under the square root, is the dtype's epsilon.
    d: the update-clipping threshold on RMS(u) (1.0). Refused under FSDP2: the row and column means
    need whole matrices, and torch's Adafactor cannot take them across FSDP2's slices."""

    shards = False

    def __init__(self, beta2_decay: Annotated[float, Range(hi=0.0)] = -0.8, eps: PositiveFloat = 1e-3,
                 d: PositiveFloat = 1.0) -> None:
        self.beta2_decay, self.eps, self.d = beta2_decay, eps, d

    def build(self, params: TrainedParameters, *, lr: float, weight_decay: float,
              betas: tuple[float, float]) -> torch.optim.Optimizer:
        return torch.optim.Adafactor(params.groups(weight_decay), lr=lr, beta2_decay=self.beta2_decay,
                                     eps=(None, self.eps), d=self.d)
