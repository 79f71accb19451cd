"""RoPE base, RoPE scaling and NoPE layers: a change of a position scheme that has no weights
(``rope``, ``alibi``, ``sinusoidal``, ``none``), for the whole model or per layer type, and with
it the model's ``max_seq_len`` (no table to grow).

No tensor changes — the same weights meet other rotation frequencies (a YaRN or linear extension,
a new base) or none at all (NoPE) — so the edit is exact in its weights and changes the function:
it reports the logit difference it makes. A short fine-tune usually heals what it moves.
"""
from __future__ import annotations

from dataclasses import replace

from seqzoo.builder import layer_plan
from seqzoo.interfaces import TransferRule
from seqzoo.registry import builtin

from ._layers import kind_of, under

#: Position schemes whose state dict is empty: switching among them moves no tensor.
WEIGHTLESS = ("rope", "alibi", "sinusoidal", "none")


@builtin("RoPE base or scaling, NoPE layers: the same weights, other positions")
class RopeTransfer(TransferRule):
    """Claims position changes between weightless schemes — of the model, of layer types, or a
    new pattern of layer types that differ in their position only (NoPE layers) —; writes
    nothing."""

    def claims(self, old: dict, new: dict, changed: list[str]) -> list[str]:
        keys = under(changed, "position")
        layout = [k for k in changed if k.split(".")[0] in ("layer_types", "pattern", "layer_overrides")
                  and k not in keys]
        if layout:
            before, after = layer_plan(old), layer_plan(new)
            strip = lambda plan: replace(plan, type=None, position={})  # noqa: E731
            if len(before) == len(after) and all(strip(a) == strip(b) for a, b in zip(before, after)) and all(
                    kind_of(p.position) in WEIGHTLESS for p in before + after):
                keys += layout
        specs = [old["position"], new["position"]]
        for key in keys:  # a layer type's or override's own position spec
            parts = key.split(".")
            if parts[0] in ("layer_types", "layer_overrides") and len(parts) > 2:
                for section in (old, new):
                    value = (section.get(parts[0]) or {}).get(parts[1])
                    specs.append(value.get("position") if isinstance(value, dict) else None)
        weightless = all(kind_of(s) in WEIGHTLESS + (None,) for s in specs)
        if "max_seq_len" in changed and weightless and kind_of(old["position"]) in WEIGHTLESS:
            keys.append("max_seq_len")  # no position table to grow or cut: a limit, nothing more
        return keys if weightless else []
