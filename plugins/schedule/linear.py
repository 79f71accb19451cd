"""Linear decay after linear warm-up: a straight line from the peak to the floor,

    factor = floor + (1 − floor) · (1 − p),   p = (step − warmup) / (steps − warmup)

BERT's schedule (Devlin et al., 2019), with a floor of 0.
"""
from __future__ import annotations

from seqzoo.interfaces import Schedule
from seqzoo.registry import builtin


@builtin("a straight line from the peak to train.min_lr_ratio after warm-up")
class Linear(Schedule):
    """No recipe params: ``train.warmup`` and ``train.min_lr_ratio`` set the warm-up and the floor."""

    def decay(self, progress: float) -> float:
        return 1 - progress
