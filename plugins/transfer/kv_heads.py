"""MHA → GQA → MQA (Ainslie et al., 2023): fewer key/value heads, each the mean of the K'/K heads
it replaces (``attention.kv_heads`` K → K' with K' dividing K).

seqzoo's ``qkv_proj`` rows are [q (H·D) | k (K·D) | v (K·D)]; the q rows stay, and new k/v head g
is the mean of old heads g·K/K' … (g + 1)·K/K' − 1 (rows and biases alike), the grouping that
grouped-query attention reads (query head h uses K/V head h // (H / K')). Approximate: the error
reported is ‖W_kv − W'_kv expanded back‖ / ‖W_kv‖ over the K/V rows, and the logit difference.
"""
from __future__ import annotations

import torch

from seqzoo.interfaces import TransferRule
from seqzoo.registry import builtin

from ._layers import block


def _pool(rows: torch.Tensor, heads: int, groups: int) -> torch.Tensor:
    """(K·D, ...) rows of K heads -> (K'·D, ...): each of the K' new heads the mean of its group."""
    d = rows.shape[0] // heads
    return rows.reshape(groups, heads // groups, d, *rows.shape[1:]).mean(1).reshape(groups * d, *rows.shape[1:])


@builtin("MHA -> GQA -> MQA: each new K/V head the mean of the heads it replaces")
class KVHeadsTransfer(TransferRule):
    """Claims attention.kv_heads in a decoder when the new count divides the old one."""

    def claims(self, old: dict, new: dict, changed: list[str]) -> list[str]:
        if "attention.kv_heads" not in changed or old["kind"] != "decoder_lm" or old.get("pattern"):
            return []
        heads = old["attention"]["heads"]
        before, after = old["attention"]["kv_heads"] or heads, new["attention"]["kv_heads"] or heads
        return ["attention.kv_heads"] if before % after == 0 and after < before else []

    def _sizes(self, old: dict, new: dict) -> tuple[int, int, int, int]:
        attn = old["attention"]
        heads, d = attn["heads"], attn["head_dim"] or old["dim"] // attn["heads"]
        return heads, d, attn["kv_heads"] or heads, new["attention"]["kv_heads"] or heads

    def transfer(self, old, new, old_state, new_state):
        heads, d, before, after = self._sizes(old, new)
        self.pairs = []  # (old K/V rows, the pooled rows expanded back), for the error
        made = {}
        for i in range(old["layers"]):
            for part in ("weight", "bias"):
                name = f"{block(i)}mixer.qkv_proj.{part}"
                if name not in old_state:
                    continue
                q, k, v = old_state[name].split([heads * d, before * d, before * d])
                pooled = [_pool(t, before, after) for t in (k, v)]
                with torch.no_grad():
                    new_state[name].copy_(torch.cat([q, *pooled]))
                if part == "weight":
                    self.pairs.append((torch.cat([k, v]), torch.cat([_expand(t, after, before) for t in pooled])))
                made[name] = f"k/v heads {before} -> {after}, each the mean of {before // after}"
        return made

    def error(self, old_state, new_state):
        num = sum(float((a - b).pow(2).sum()) for a, b in self.pairs)
        den = sum(float(a.pow(2).sum()) for a, _ in self.pairs)
        return {"relative K/V weight error": (num / den) ** 0.5 if den else 0.0}


def _expand(rows: torch.Tensor, heads: int, back_to: int) -> torch.Tensor:
    """(K'·D, ...) rows back to K·D: each head repeated for the K / K' heads it replaced."""
    d = rows.shape[0] // heads
    return rows.reshape(heads, d, *rows.shape[1:]).repeat_interleave(back_to // heads, 0).reshape(
        back_to * d, *rows.shape[1:])
