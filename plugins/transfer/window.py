"""A sliding-window change (``attention.window``, for the model or a layer type): the same weights
attend over a shorter or longer span, or all of it. Nothing is written; the edit reports the
logit difference on its probe (zero when the probe fits in both windows)."""
from __future__ import annotations

from seqzoo.interfaces import TransferRule
from seqzoo.registry import builtin

from ._layers import under


@builtin("a sliding-window change: the same weights, another span")
class WindowTransfer(TransferRule):
    """Claims window changes; writes nothing."""

    def claims(self, old: dict, new: dict, changed: list[str]) -> list[str]:
        return under(changed, "attention.window")
