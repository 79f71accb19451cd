"""Warmup-stable-decay (Hu et al., 2024, "MiniCPM"; the schedule of DeepSeek, SmolLM and OLMo 2,
and torchtitan's): linear warm-up, the peak rate held, then a decay over the run's last fraction,

    factor = 1                                     warmup ≤ step < steps − n,  n = round(decay · steps)
           = floor + (1 − floor) · shape(p)        p = (step − (steps − n)) / n

with shape(p) = 1 − p (linear), ½·(1 + cos(π·p)) (cosine) or 1 − √p (sqrt, MiniCPM's and
DeepSeek's fast first drop). A checkpoint from the stable phase can be decayed to several lengths.
"""
from __future__ import annotations

import math
from typing import Literal

from seqzoo.interfaces import Schedule
from seqzoo.registry import builtin
from seqzoo.schema import UnitInterval


@builtin("warm-up, the peak held, then a decay over the last fraction (MiniCPM, OLMo 2, torchtitan)")
class WSD(Schedule):
    """decay: the fraction of the run's steps that decay, at its end (0.2; the decay starts no
    earlier than the warm-up's end). shape: linear | cosine | sqrt, the decay's curve (linear).
    ``train.min_lr_ratio`` is where it ends (set 0 to decay to zero, as MiniCPM)."""

    def __init__(self, decay: UnitInterval = 0.2, shape: Literal["linear", "cosine", "sqrt"] = "linear") -> None:
        self.fraction, self.shape = decay, shape

    def factor(self, step: int, steps: int, warmup: int, floor: float) -> float:
        if step < warmup:
            return (step + 1) / warmup
        start = max(steps - round(self.fraction * steps), warmup)
        if step < start:
            return 1.0
        progress = min((step - start) / max(steps - start, 1), 1.0)
        return floor + (1 - floor) * self.decay(progress)

    def decay(self, progress: float) -> float:
        if self.shape == "cosine":
            return 0.5 * (1 + math.cos(math.pi * progress))
        if self.shape == "sqrt":
            return 1 - math.sqrt(progress)
        return 1 - progress
