"""A constant rate after linear warm-up: factor = 1 from step ``warmup`` on (fine-tuning, surgery's
healing runs); ``train.min_lr_ratio`` is not used.
"""
from __future__ import annotations

from seqzoo.interfaces import Schedule
from seqzoo.registry import builtin


@builtin("the peak rate after warm-up, to the end")
class Constant(Schedule):
    """No recipe params: ``train.warmup`` sets the warm-up."""

    def factor(self, step: int, steps: int, warmup: int, floor: float) -> float:
        return (step + 1) / warmup if step < warmup else 1.0
