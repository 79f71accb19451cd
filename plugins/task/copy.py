"""Synthetic task `copy`: the answer is the string itself."""
from __future__ import annotations

from seqzoo.registry import builtin
from seqzoo.schema import PositiveInt

from ._strings import StringTask


@builtin("copy a string (abc -> abc)")
class CopyTask(StringTask):
    """min_len/max_len: training lengths (1, 8). eval_min_len/eval_max_len: held-out lengths (null
    = training ones). alphabet: characters to draw from (a–z)."""

    variant = "copy"

    def __init__(self, min_len: PositiveInt = 1, max_len: PositiveInt = 8,
                 eval_min_len: PositiveInt | None = None, eval_max_len: PositiveInt | None = None,
                 alphabet: str = "abcdefghijklmnopqrstuvwxyz") -> None:
        super().__init__(min_len, max_len, eval_min_len, eval_max_len, alphabet)

    def answer(self, text: str) -> str:
        return text
