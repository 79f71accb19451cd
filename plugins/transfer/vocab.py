"""Resizing the vocabulary (``vocab_size`` V → V'): the embedding's and an untied head's first
min(V, V') rows are copied; new rows are the mean of the old ones, so a new token starts as an
average token (Hewitt, 2021). Exact for the old vocabulary when it grows: every old token's
logits are what they were (the new tokens only add entries the old softmax never had)."""
from __future__ import annotations

import torch

from seqzoo.interfaces import TransferRule
from seqzoo.registry import builtin


@builtin("a bigger or smaller vocabulary: rows copied, new ones at the mean")
class VocabTransfer(TransferRule):
    """Claims ``vocab_size``; exact when it grows."""

    def claims(self, old: dict, new: dict, changed: list[str]) -> list[str]:
        if "vocab_size" not in changed:
            return []
        self.exact = new["vocab_size"] > old["vocab_size"]
        return ["vocab_size"]

    def transfer(self, old, new, old_state, new_state):
        keep = min(old["vocab_size"], new["vocab_size"])
        made = {}
        for name in ("embed.weight", "lm_head.weight", "lm_head.bias"):
            if name not in new_state or name not in old_state:
                continue
            rows = old_state[name]
            with torch.no_grad():
                new_state[name][:keep] = rows[:keep]
                new_state[name][keep:] = rows.mean(0)
            made[name] = f"{keep} rows copied, {new['vocab_size'] - keep} at the mean row" if new[
                "vocab_size"] > keep else f"first {keep} rows kept"
        return made
