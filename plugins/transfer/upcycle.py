"""Dense → mixture of experts by sparse upcycling (Komatsuzaki et al., 2022): every expert starts
as a copy of the layer's trained dense FFN, the router as the new model initialises it.

All experts being equal, the layer computes Σ_j w_j · FFN(x) = (Σ_j w_j) · FFN(x): the dense
output exactly when the chosen weights sum to one — a softmax router that renormalises its
top-k (``softmax_topk`` with ``normalize``), gpt-oss's ``topk_softmax``, DeepSeek's
``sigmoid_grouped`` with ``normalize`` — and no shared expert or routed scale adds to it. Then
the rule is exact and the edit checks identical logits; otherwise it reports the difference.
Training then lets the copies drift apart.
"""
from __future__ import annotations

import torch

from seqzoo.interfaces import TransferRule
from seqzoo.registry import builtin

from ._layers import block, kind_of


@builtin("dense FFN -> mixture of experts, every expert a copy (sparse upcycling)")
class UpcycleTransfer(TransferRule):
    """Claims a model-level ffn change from a dense FFN to a moe whose experts are that FFN."""

    def claims(self, old: dict, new: dict, changed: list[str]) -> list[str]:
        keys = [k for k in changed if k == "ffn" or k.startswith("ffn.")]
        dense, moe = old["ffn"], new["ffn"]
        if not keys or old["kind"] != "decoder_lm" or kind_of(moe) != "moe" or kind_of(dense) in (None, "moe"):
            return []
        expert = moe["expert"] if isinstance(moe["expert"], dict) else {"kind": moe["expert"]}
        same = {**dense, "kind": kind_of(dense)} == {**dense, **expert}
        if not same:
            return []
        router = moe["router"] if isinstance(moe["router"], dict) else {"kind": moe["router"]}
        sums_to_one = (router["kind"] == "topk_softmax" or router.get("normalize", True)) \
            and router["kind"] in ("softmax_topk", "topk_softmax", "sigmoid_grouped")
        self.exact = bool(sums_to_one and moe.get("shared") is None and moe.get("routed_scale", 1.0) == 1.0)
        return keys

    def transfer(self, old, new, old_state, new_state):
        made = {}
        experts = new["ffn"]["experts"]
        for i in range(old["layers"]):
            b = f"{block(i)}ffn."
            made.update({n: "initialised (the new model's router)" for n in new_state if n.startswith(f"{b}router.")})
            if f"{b}experts.gate_up" in new_state:  # gated experts, stacked
                gate_up = torch.cat([old_state[f"{b}gate.weight"], old_state[f"{b}up.weight"]])
                with torch.no_grad():
                    new_state[f"{b}experts.gate_up"].copy_(gate_up.expand(experts, *gate_up.shape))
                    down = old_state[f"{b}down.weight"]
                    new_state[f"{b}experts.down"].copy_(down.expand(experts, *down.shape))
                    for part in ("bias",):
                        if f"{b}experts.gate_up_{part}" in new_state:
                            both = torch.cat([old_state[f"{b}gate.{part}"], old_state[f"{b}up.{part}"]])
                            new_state[f"{b}experts.gate_up_{part}"].copy_(both.expand(experts, *both.shape))
                            new_state[f"{b}experts.down_{part}"].copy_(
                                old_state[f"{b}down.{part}"].expand(experts, -1))
                made.update({n: f"{experts} copies of the dense FFN" for n in new_state
                             if n.startswith(f"{b}experts.")})
            else:  # a list of expert modules: each the dense FFN's tensors
                for name in [n for n in new_state if n.startswith(f"{b}experts.")]:
                    source = b + name[len(f"{b}experts."):].split(".", 1)[1]
                    with torch.no_grad():
                        new_state[name].copy_(old_state[source])
                    made[name] = f"copy of {source}"
        return made
