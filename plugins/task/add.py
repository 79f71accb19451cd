"""Synthetic task `add`: multi-digit addition, ``123+45`` -> ``168``."""
from __future__ import annotations

import random

from seqzoo.errors import ConfigError
from seqzoo.interfaces import Task
from seqzoo.registry import builtin
from seqzoo.schema import PositiveInt


@builtin("multi-digit addition (123+45 -> 168)")
class AddTask(Task):
    """min_len/max_len: digits per operand for training (1, 3). eval_min_len/eval_max_len: digits
    for held-out examples (null = training ones)."""

    def __init__(self, min_len: PositiveInt = 1, max_len: PositiveInt = 3,
                 eval_min_len: PositiveInt | None = None, eval_max_len: PositiveInt | None = None) -> None:
        self.digits = {"train": (min_len, max_len),
                       "eval": (eval_min_len or min_len, eval_max_len or max_len)}
        for split, (low, high) in self.digits.items():
            if low > high:
                prefix = "" if split == "train" else "eval_"
                raise ConfigError(f"task add: {prefix}min_len={low} is larger than {prefix}max_len={high}")

    def _number(self, rng: random.Random, split: str) -> int:
        digits = rng.randint(*self.digits[split])
        return rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10 ** digits - 1)

    def example(self, rng: random.Random, split: str = "train") -> tuple[str, str]:
        a, b = self._number(rng, split), self._number(rng, split)
        return f"{a}+{b}", str(a + b)
