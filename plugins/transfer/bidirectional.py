"""Causal → bidirectional: a decoder (``decoder_lm``) becomes an ``encoder`` whose every token
attends to the whole sequence, on the decoder's trained layers (LLM2Vec, BehnamGhader et al.,
2024, whose next step, masked next-token training, is a ``seqzoo train`` of the result).

The stack's tensors move from ``decoder.*`` to ``encoder.*`` unchanged, the token embedding
stays; the LM head is dropped (an encoder returns hidden states), token-type embeddings start at
zero (adding nothing) and a pooler or masked-LM head, if asked for, as the new model initialises
it. The rule measures how far the hidden states moved, at the last token and at the others. In
the first layer the last token attends to every token under either mask, so a one-layer model's
last token does not move at all; from the second layer on it reads earlier tokens that now saw
the future, and moves too.
"""
from __future__ import annotations

import torch
from torch import nn

from seqzoo.interfaces import TransferRule
from seqzoo.registry import builtin


@builtin("decoder -> bidirectional encoder on the same layers (LLM2Vec)")
class BidirectionalTransfer(TransferRule):
    """Claims ``kind`` decoder_lm → encoder and the keys one kind has and the other lacks."""

    def claims(self, old: dict, new: dict, changed: list[str]) -> list[str]:
        if old["kind"] != "decoder_lm" or new["kind"] != "encoder" or old.get("scale_embeddings"):
            return []
        own = set(old) ^ set(new)
        return [k for k in changed if k == "kind" or k.split(".")[0] in own]

    def transfer(self, old, new, old_state, new_state):
        made = {}
        for name in new_state:
            if name.startswith("encoder."):
                with torch.no_grad():
                    new_state[name].copy_(old_state["decoder." + name[len("encoder."):]])
                made[name] = "the decoder's"
            elif name.startswith("token_type."):
                with torch.no_grad():
                    new_state[name].zero_()
                made[name] = "zeros (adds nothing)"
            elif name.startswith(("pooler.", "mlm_head.")):
                made[name] = "initialised (the new model's)"
        return made

    def measure(self, old: nn.Module, new: nn.Module, probe: torch.Tensor) -> dict[str, float]:
        causal = old.decoder(old.embed(probe))  # (B, T, C): the decoder's final hidden states
        both = new(probe)
        return {"hidden-state change, last token": (causal[:, -1] - both[:, -1]).abs().max().item(),
                "hidden-state change, earlier tokens": (causal[:, :-1] - both[:, :-1]).abs().max().item()}
