"""Cosine decay after linear warm-up (Loshchilov & Hutter, 2017, "SGDR"; GPT-3's schedule): from
the peak to the floor along half a cosine,

    factor = floor + (1 − floor) · ½·(1 + cos(π·p)),   p = (step − warmup) / (steps − warmup)

the default schedule.
"""
from __future__ import annotations

import math

from seqzoo.interfaces import Schedule
from seqzoo.registry import builtin


@builtin("half a cosine from the peak to train.min_lr_ratio after warm-up; the default")
class Cosine(Schedule):
    """No recipe params: ``train.warmup`` and ``train.min_lr_ratio`` set the warm-up and the floor."""

    def decay(self, progress: float) -> float:
        return 0.5 * (1 + math.cos(math.pi * progress))
