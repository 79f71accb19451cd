"""The shared shape of the synthetic string tasks: a random string in, a function of it out."""
from __future__ import annotations

import random
import string

from seqzoo.errors import ConfigError
from seqzoo.interfaces import Task


class StringTask(Task):
    """alphabet: the characters strings are drawn from (lowercase letters). min_len/max_len:
    training string lengths (inclusive). eval_min_len/eval_max_len: held-out lengths (null = the
    training ones; set them higher to test length generalisation)."""

    #: The registry name, for error messages.
    variant = "string task"

    def __init__(self, min_len: int = 1, max_len: int = 8, eval_min_len: int | None = None,
                 eval_max_len: int | None = None, alphabet: str = string.ascii_lowercase) -> None:
        self.lengths = {"train": (min_len, max_len),
                        "eval": (eval_min_len or min_len, eval_max_len or max_len)}
        for split, (low, high) in self.lengths.items():
            if low > high:
                prefix = "" if split == "train" else "eval_"
                raise ConfigError(f"task {self.variant}: {prefix}min_len={low} is larger than "
                                  f"{prefix}max_len={high}")
        if not alphabet or self.separator in alphabet:
            raise ConfigError(f"task {self.variant}: alphabet must be non-empty and must not contain "
                              f"the separator {self.separator!r}")
        self.alphabet = alphabet

    def answer(self, text: str) -> str:
        raise NotImplementedError(f"{type(self).__name__} must implement answer(text)")

    def example(self, rng: random.Random, split: str = "train") -> tuple[str, str]:
        low, high = self.lengths[split]
        text = "".join(rng.choice(self.alphabet) for _ in range(rng.randint(low, high)))
        return text, self.answer(text)
