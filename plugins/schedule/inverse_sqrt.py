"""The Transformer's schedule (Vaswani et al., 2017, "Attention Is All You Need", §5.3): a linear
warm-up, then decay with the inverse square root of the step,

    lr(s) = d^−0.5 · min(s^−0.5, s · w^−1.5),   s = step + 1,  w = warmup

written as a fraction of the peak it reaches at s = w: factor = min(√(w/s), s/w), so
``train.lr = d^−0.5 · w^−0.5`` gives the paper's rates exactly (7.0e-4 for d = 512, w = 4000).
It never ends, so ``train.min_lr_ratio`` and the run's length do not enter; with no warm-up
(w = 0) the decay starts at the first step, factor = 1/√s.
"""
from __future__ import annotations

import math

from seqzoo.interfaces import Schedule
from seqzoo.registry import builtin


@builtin("the Transformer's: linear warm-up, then ∝ 1/√step (Vaswani et al., 2017)")
class InverseSqrt(Schedule):
    """No recipe params: ``train.warmup`` is w; ``train.lr`` is the peak, d^−0.5 · w^−0.5 for the
    paper's rates."""

    def factor(self, step: int, steps: int, warmup: int, floor: float) -> float:
        s, w = step + 1, max(warmup, 1)
        return min(math.sqrt(w / s), s / w)
