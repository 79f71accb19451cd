"""Adding or removing layers (``layers`` N → M; depth up-scaling, Kim et al., 2023, "SOLAR"): new
layer i is a copy of old layer ⌊i·N/M⌋ — each layer repeated in place when the model grows,
evenly spaced layers kept when it shrinks. Approximate: the edit reports the logit difference
(duplicated layers add their residual updates twice), which continued training is for."""
from __future__ import annotations

import torch

from seqzoo.interfaces import TransferRule
from seqzoo.registry import builtin

from ._layers import block


@builtin("more or fewer layers: each new layer a copy of an old one (depth up-scaling)")
class DepthTransfer(TransferRule):
    """Claims ``layers`` of a uniform decoder (no pattern)."""

    def claims(self, old: dict, new: dict, changed: list[str]) -> list[str]:
        uniform = not old.get("pattern") and not old.get("layer_overrides")
        return ["layers"] if "layers" in changed and old["kind"] == "decoder_lm" and uniform else []

    def transfer(self, old, new, old_state, new_state):
        before, after = old["layers"], new["layers"]
        made = {}
        for i in range(after):
            source = i * before // after
            for name in [n for n in new_state if n.startswith(block(i))]:
                with torch.no_grad():
                    new_state[name].copy_(old_state[block(source) + name[len(block(i)):]])
                made[name] = f"copy of layer {source}"
        return made
