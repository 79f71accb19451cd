"""RWKV-4 (Peng et al., 2023, "RWKV: Reinventing RNNs for the Transformer Era"; transformers' ``rwkv``,
the RWKV-4 "Pile" and "Raven" models) <-> ``decoder_lm``: each RWKV block is two seqzoo layers, each
a mixer alone (as recipes/tiny-rwkv4.yaml lays them out):

    h ← h + rwkv4(ln1(h))                            the time mix (docs/formulas.md §15.11)
    h ← h + rwkv_channel_mix(ln2(h))                 with receptance: true
    logits = head(ln_out(h))                          after pre_ln on the embeddings (block 0)

- Time mix (``attention``): ``time_decay``, ``time_first`` and ``key`` / ``value`` / ``receptance``
  / ``output`` as they are, ``attention_hidden_size`` wide (the mixer's ``width``); the three
  ``time_mix_*`` (1, 1, C) stacked into ``time_mix`` (3, C), the weights of the current token.
- Channel mix (``feed_forward``): ``key`` / ``value`` / ``receptance`` are ``up`` / ``down`` /
  ``receptance``, ``intermediate_size`` wide; seqzoo's token shift weighs the previous token, so
  ``x_k`` = 1 − ``time_mix_key`` and ``x_r`` = 1 − ``time_mix_receptance``.
- Norms: LayerNorms with ``layer_norm_epsilon``; ``pre_ln`` is the ``embed_norm``; ``ln_out`` has
  transformers' default ε 1e-5 whatever the config says. The head is untied unless
  ``tie_word_embeddings``.

``rescale_every`` N: in eval mode transformers divides each block's ``output`` and
``feed_forward.value`` weights by 2^⌊i / N⌋ and halves the hidden states after every N-th block (in
train mode it undoes this and computes the plain model). In exact arithmetic that changes nothing
but the LayerNorms' ε: a LayerNorm of h / s with ε is one of h with ε·s². So the import reads the
stored (train-mode) weights as they are and gives the blocks of group g = ⌊i / N⌋ the ε
``layer_norm_epsilon``·4^g — layer types ``time``, ``channel`` for g = 0, ``time_g``, ``channel_g``
after — which is transformers' eval-mode model, as float32 computes it: scaling by powers of two is
exact. ``ln_out`` sees the states halved ⌊L / N⌋ times: ε 1e-5·4^⌊L/N⌋. seqzoo's final norm is the
last layer's norm, so where that ε differs from the last block's own (L a multiple of N, as in
RWKV-4-169M's 12 blocks with N = 6, or ``layer_norm_epsilon`` ≠ 1e-5) the last layer takes the final
norm's (``layer_overrides``) and its ln2 alone is off, by its ε: the logits then differ by up to
6e-5 in the tests' random models, whose states are of order 1 (trained RWKV-4 states are far larger,
which shrinks it); a final norm of its own in the recipe would make it exact.

transformers sizes its cached state by ``hidden_size``, so a model whose ``attention_hidden_size``
differs runs only with ``use_cache: false`` (exports write it so); its one-token step mixes the rows
of a batch (``RwkvSelfAttention.extract_key_value`` broadcasts (B, 1, C) with (B, C)), so its cached
``generate`` is right for one row only. It ignores ``attention_mask``: padded positions enter its
state as tokens, where seqzoo's padding leaves the state as it was.
"""
from __future__ import annotations

import math
from collections.abc import Collection

import torch
from torch import nn

from seqzoo.builder import layer_plan
from seqzoo.io.hf import (
    CausalLMConverter,
    Rule,
    copy,
    first_problem,
    kind_of,
    layer_pattern,
    linear,
    norm,
    renamed,
    special_ids,
)
from seqzoo.io.hf.config import HFConfig
from seqzoo.registry import builtin

#: RwkvConfig's defaults (attention_hidden_size and intermediate_size null: C and 4·C).
DEFAULTS = {"vocab_size": 50277, "context_length": 1024, "hidden_size": 4096, "num_hidden_layers": 32,
            "attention_hidden_size": None, "intermediate_size": None, "layer_norm_epsilon": 1e-5,
            "rescale_every": 6, "tie_word_embeddings": False, "use_cache": True}
OUT_EPS = 1e-5  # ln_out: nn.LayerNorm's default ε, which transformers' RwkvModel never changes
TIME = {"mixer.k_proj": "attention.key", "mixer.v_proj": "attention.value", "mixer.r_proj": "attention.receptance",
        "mixer.out_proj": "attention.output"}
CHANNEL = {"mixer.up": "feed_forward.key", "mixer.down": "feed_forward.value",
           "mixer.receptance": "feed_forward.receptance"}
MIXES = ("time_mix_key", "time_mix_value", "time_mix_receptance")


def group_eps(eps: float, rescale_every: int, layers: int) -> tuple[list[float], float]:
    """(ε of each block's LayerNorms, ε of the final norm) in transformers' eval-mode model read on
    unscaled states: ``eps``·4^⌊i / N⌋ and 1e-5·4^⌊L / N⌋ (N ≤ 0: no rescaling)."""
    group = (lambda i: i // rescale_every) if rescale_every > 0 else (lambda i: 0)
    return [eps * 4.0 ** group(i) for i in range(layers)], OUT_EPS * 4.0 ** group(layers)


def type_name(kind: str, group: int) -> str:
    """The layer type of a ``time`` or ``channel`` layer in rescale group ``group``: ``time``, ``time_1``, ..."""
    return kind if group == 0 else f"{kind}_{group}"


def stacked_mixes(target: str, prefix: str) -> Rule:
    """``time_mix`` (3, C) from the three (1, 1, C) ``time_mix_*`` under ``prefix``."""
    return Rule(target, tuple(prefix + name for name in MIXES), lambda *t: torch.cat([x.reshape(1, -1) for x in t]),
                lambda t: tuple(row.reshape(1, 1, -1) for row in t))


def complement(target: str, source: str) -> Rule:
    """seqzoo's weight of the previous token, x (C,), from transformers' of the current one, μ (1, 1, C): 1 − μ."""
    return Rule(target, (source,), lambda t: 1 - t.reshape(-1), lambda t: ((1 - t).reshape(1, 1, -1),))


@builtin("Hugging Face RWKV (RWKV-4) <-> decoder_lm (time-mix and channel-mix layers, token shift, LayerNorms)")
class RwkvConverter(CausalLMConverter):
    """config.json keys: vocab_size, hidden_size, num_hidden_layers, attention_hidden_size,
    intermediate_size, layer_norm_epsilon, rescale_every, context_length (the recipe's
    max_seq_len; the state takes any length), tie_word_embeddings; use_cache is written, not read."""

    model_type = "rwkv"
    architecture = "RwkvForCausalLM"
    base_prefix = "rwkv."
    embedding = "rwkv.embeddings.weight"

    def config(self, config: dict) -> HFConfig:
        c = HFConfig(config, DEFAULTS)
        dim = c.positive_int("hidden_size")
        c["attention_hidden_size"] = c["attention_hidden_size"] or dim
        c["intermediate_size"] = c["intermediate_size"] or 4 * dim
        for key in ("num_hidden_layers", "attention_hidden_size", "intermediate_size", "vocab_size",
                    "context_length"):
            c.positive_int(key)
        c.positive_number("layer_norm_epsilon")
        if isinstance(c["rescale_every"], bool) or not isinstance(c["rescale_every"], int):
            raise c.refuse("rescale_every", "it must be an integer (≤ 0: no rescaling)")
        return c

    def recipe(self, config: dict, names: Collection[str] = ()) -> dict:
        c = self.config(config)
        layers, eps = c["num_hidden_layers"], c["layer_norm_epsilon"]
        blocks, last = group_eps(eps, c["rescale_every"], layers)
        channel = {"kind": "rwkv_channel_mix", "hidden": c["intermediate_size"], "receptance": True}
        groups = list(dict.fromkeys(blocks))  # one ε per rescale group, in order
        types = {}
        for g, group in enumerate(groups):
            scaled = {} if g == 0 else {"norm": {"kind": "layernorm", "eps": group}}
            types[type_name("time", g)], types[type_name("channel", g)] = dict(scaled), {"mixer": channel, **scaled}
        kinds = [type_name(kind, groups.index(e)) for e in blocks for kind in ("time", "channel")]
        model = {"kind": "decoder_lm", "vocab_size": c["vocab_size"], "dim": c["hidden_size"], "layers": 2 * layers,
                 "max_seq_len": c["context_length"], "position": "none", "norm": {"kind": "layernorm", "eps": eps},
                 "embed_norm": {"kind": "layernorm", "eps": eps}, "placement": "pre",
                 "mixer": {"kind": "rwkv4", "width": c["attention_hidden_size"]}, "ffn": None,
                 "tie_embeddings": c.flag("tie_word_embeddings"), "layer_types": types,
                 "pattern": layer_pattern(kinds)}
        if last != blocks[-1]:  # the final norm is the last layer's: that layer's ln2 takes ln_out's ε
            model["layer_overrides"] = {2 * layers - 1: {"norm": {"kind": "layernorm", "eps": last}}}
        return {"model": model}

    def rules(self, config: dict, recipe: dict) -> list[Rule]:
        m = recipe["model"]
        rules = [*norm("decoder.embed_norm", "rwkv.blocks.0.pre_ln")]
        for i in range(m["layers"] // 2):
            h, time, channel = f"rwkv.blocks.{i}.", f"decoder.blocks.{2 * i}.", f"decoder.blocks.{2 * i + 1}."
            rules += [*norm(time + "mixer_norm", h + "ln1"), *norm(channel + "mixer_norm", h + "ln2")]
            rules += [copy(time + "mixer." + name, h + "attention." + name) for name in ("time_decay", "time_first")]
            rules.append(stacked_mixes(time + "mixer.time_mix", h + "attention."))
            rules += renamed(time, h, TIME, False) + renamed(channel, h, CHANNEL, False)
            rules += [complement(channel + "mixer.x_k", h + "feed_forward.time_mix_key"),
                      complement(channel + "mixer.x_r", h + "feed_forward.time_mix_receptance")]
        rules += [copy("embed.weight", self.embedding), *norm("decoder.final_norm", "rwkv.ln_out")]
        return rules if m["tie_embeddings"] else [*rules, *linear("lm_head", "head", False)]

    def aliases(self, config: dict, recipe: dict) -> dict[str, str]:
        return {"head.weight": self.embedding} if recipe["model"]["tie_embeddings"] else {}

    # -- model -> config.json ------------------------------------------------------------------------
    def rescaling(self, recipe: dict) -> tuple[float, int] | None:
        """(layer_norm_epsilon, rescale_every) whose ε per block and final ε (``group_eps``) the
        recipe's LayerNorms have — the last layer's being the final norm's —, or None."""
        plans = layer_plan(recipe["model"])
        if len(plans) % 2 or any(kind_of(p.norm) != "layernorm" for p in plans):
            return None
        eps, blocks = [p.norm["eps"] for p in plans], len(plans) // 2
        every = next((i for i in range(1, blocks) if not math.isclose(eps[2 * i], eps[0])), 0)
        if not every and math.isclose(eps[-1], OUT_EPS * 4):
            every = blocks  # halved once, after the last block: only ln_out sees it
        expected, last = group_eps(eps[0], every, blocks)
        per_layer = [e for e in expected for _ in range(2)][:-1] + [last]
        return (eps[0], every) if all(math.isclose(a, b) for a, b in zip(eps, per_layer)) else None

    def accepts(self, recipe: dict) -> str | None:
        m = recipe["model"]
        if m["kind"] != "decoder_lm":
            return f"model.kind is {m['kind']}, needs decoder_lm"
        plans = layer_plan(m)
        kinds = [p.mixer["kind"] for p in plans]
        time, channel = plans[0].mixer, plans[min(1, len(plans) - 1)].mixer
        shape = [(p.placement, p.residual, p.mixer_norm, p.residual_multiplier, kind_of(p.position), p.ffn)
                 for p in plans]
        embed = m["embed_norm"]
        return first_problem(
            (kinds == ["rwkv4", "rwkv_channel_mix"] * (len(plans) // 2),
             "model.pattern: RWKV's layers alternate rwkv4 and rwkv_channel_mix, beginning with rwkv4"),
            (all(p.mixer == time for p in plans[::2]) and all(p.mixer == channel for p in plans[1::2]),
             "model.layer_types: RWKV's time mixes are all alike, and so are its channel mixes"),
            (channel.get("receptance") is True,
             "model.layer_types: RWKV-4's channel mix has a receptance (receptance: true)"),
            (all(s == ("pre", "sequential", True, 1.0, "none", None) for s in shape),
             "model: RWKV's layers are a pre-norm mixer alone, added unscaled, with no position scheme"),
            (self.rescaling(recipe) is not None,
             "model.norm: RWKV's LayerNorms share one ε, times 4 after every rescale_every blocks (transformers' "
             "eval mode), and the last layer's is ln_out's (1e-5, times 4 per rescale)"),
            (embed is not None and kind_of(embed) == "layernorm" and math.isclose(embed["eps"], plans[0].norm["eps"]),
             "model.embed_norm: RWKV normalises its embeddings (pre_ln) with the blocks' LayerNorm"),
            (not m["scale_embeddings"] and m["final_softcap"] is None and m["embedding_multiplier"] == 1.0
             and m["logits_multiplier"] == 1.0, "model: RWKV has no embedding scale, multipliers or softcap"),
        )

    def hf_config(self, model: nn.Module) -> dict:
        m = model.recipe["model"]
        eps, every = self.rescaling(model.recipe)
        time, channel = model.decoder.blocks[0].mixer, model.decoder.blocks[1].mixer
        return {"vocab_size": m["vocab_size"], "hidden_size": m["dim"], "num_hidden_layers": m["layers"] // 2,
                "attention_hidden_size": time.width, "intermediate_size": channel.hidden,
                "layer_norm_epsilon": eps, "rescale_every": every, "context_length": m["max_seq_len"],
                "tie_word_embeddings": m["tie_embeddings"], "use_cache": time.width == m["dim"], **special_ids(model)}
