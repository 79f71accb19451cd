"""gpt-oss (OpenAI, 2025) <-> ``decoder_lm``: LLaMA's pre-norm RMSNorm layers with biases on every
attention projection, a learned sink logit per head (``attention.sinks``), sliding-window and
full layers alternating as ``layer_types`` says (``layer_types`` {local: {attention: {window}},
global: {}} + their ``pattern``), YaRN RoPE, and in every layer a mixture of experts:

- router: logits W x + b, the top-k kept, a softmax over those k (``router: topk_softmax``);
- experts: the clamped SwiGLU (``ffn: clamped_swiglu``, α = ``swiglu_alpha``, L =
  ``swiglu_limit``) with biases, stored stacked as ``experts.gate_up_proj`` (E, C, 2F) with gate
  and up interleaved, ``down_proj`` (E, F, C) and their biases (see ``_moe``).
"""
from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

import torch
from torch import nn

from seqzoo.builder import layer_plan
from seqzoo.errors import CheckpointError
from seqzoo.io.gguf import EXPERT_KEYS, LLAMA_KEYS, GGUFArch, Key, Transform
from seqzoo.io.gguf.arch import layer_types, sliding_flags
from seqzoo.io.hf import Rule, first_problem, kind_of, layer_pattern
from seqzoo.io.hf.decoder import LLAMA_DEFAULTS, DecoderConverter, DecoderFamily
from seqzoo.registry import builtin

from ._moe import stacked_expert_rules, without_layout

#: transformers' layer_types names and the recipe's.
KINDS = {"sliding_attention": "local", "full_attention": "global"}


def interleaved_gate_up(hf: str, gguf_name: str | None, config) -> Rule:
    """gpt-oss's experts.gate_up_proj (E, C, 2F), gate at even and up at odd columns, as llama.cpp's
    ffn_gate_exps and ffn_up_exps (E, F, C); its bias (E, 2F) likewise as two (E, F)."""
    block = hf.split(".")[2]
    part = "bias" if hf.endswith("_bias") else "weight"
    names = (f"blk.{block}.ffn_gate_exps.{part}", f"blk.{block}.ffn_up_exps.{part}")
    if part == "bias":
        return Rule(hf, names, lambda g, u: torch.stack([g, u], -1).flatten(-2),
                    lambda t: (t[..., 0::2].contiguous(), t[..., 1::2].contiguous()))
    return Rule(hf, names, lambda g, u: torch.stack([g.transpose(1, 2), u.transpose(1, 2)], -1).flatten(-2),
                lambda t: (t[..., 0::2].transpose(1, 2).contiguous(), t[..., 1::2].transpose(1, 2).contiguous()))


def experts_transposed(hf: str, gguf_name: str | None, config) -> Rule:
    """experts.down_proj (E, F, C) as llama.cpp's ffn_down_exps (E, C, F)."""
    name = f"blk.{hf.split('.')[2]}.ffn_down_exps.weight"
    return Rule(hf, (name,), lambda t: t.transpose(1, 2).contiguous(), lambda t: (t.transpose(1, 2).contiguous(),))


def gpt_oss_gguf_problem(config) -> str | None:
    if (config["swiglu_alpha"], config["swiglu_limit"]) != (1.702, 7.0):
        return (f"llama.cpp's gpt-oss clamps its SwiGLU at α 1.702, limit 7.0; this model's are "
                f"{config['swiglu_alpha']}, {config['swiglu_limit']}")
    return None


@builtin("Hugging Face gpt-oss <-> decoder_lm (sinks, alternating windows, top-k softmax experts with the "
         "clamped SwiGLU)")
class GptOssConverter(DecoderConverter):
    """LLaMA's keys plus head_dim, attention_bias (true), sliding_window, layer_types,
    num_local_experts, num_experts_per_tok, intermediate_size (each expert's width), swiglu_alpha,
    swiglu_limit and router_aux_loss_coef."""

    family = DecoderFamily(
        "gpt_oss", "GptOssForCausalLM", "gpt-oss",
        defaults={**LLAMA_DEFAULTS, "vocab_size": 201088, "hidden_size": 2880, "intermediate_size": 2880,
                  "num_hidden_layers": 36, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
                  "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "attention_bias": True,
                  "sliding_window": 128, "layer_types": None, "num_local_experts": 128, "num_experts_per_tok": 4,
                  "swiglu_alpha": 1.702, "swiglu_limit": 7.0, "router_aux_loss_coef": 0.001})
    # llama.cpp's gpt-oss: experts split from the interleaved gate/up and laid out per expert as
    # [E, F, C], the clamped SwiGLU's constants and the softmax over the chosen experts hard-coded.
    gguf = GGUFArch("gpt-oss", renames={r"experts\.down_proj_bias$": "experts.down_proj.bias",
                                        r"self_attn\.sinks$": "self_attn.sinks.weight"},
                    keys=LLAMA_KEYS + EXPERT_KEYS + (
                        Key("expert_feed_forward_length", "intermediate_size"),
                        Key("attention.sliding_window", "sliding_window")),
                    output="required", problem=gpt_oss_gguf_problem,
                    transforms=(Transform(r"experts\.gate_up_proj$", interleaved_gate_up),
                                Transform(r"experts\.gate_up_proj_bias$", interleaved_gate_up),
                                Transform(r"experts\.down_proj$", experts_transposed)),
                    export=lambda c: {"rope.dimension_count": c["head_dim"],
                                      "attention.sliding_window_pattern": sliding_flags(c)},
                    config=lambda get: {"layer_types": layer_types(get("attention.sliding_window_pattern")),
                                        "attention_bias": True, "swiglu_alpha": 1.702, "swiglu_limit": 7.0})

    def layer_kinds(self, c: dict) -> list[str]:
        """``local`` or ``global`` per layer (transformers' default: sliding at even layers)."""
        n = c["num_hidden_layers"]
        types = c["layer_types"] or ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
        unknown = sorted(set(types) - set(KINDS))
        if unknown or len(types) != n:
            raise CheckpointError(f"config.json: layer_types {types!r} is not supported; it must name "
                                  f"sliding_attention or full_attention for each of the {n} layers")
        return [KINDS[t] for t in types]

    def recipe(self, config: dict, names: Collection[str] = ()) -> dict:
        recipe = super().recipe(config, names)
        c = self.config(config)
        m = recipe["model"]
        m["attention"]["sinks"] = True
        kinds = self.layer_kinds(c)
        if "local" in kinds:
            types = {"local": {"attention": {"window": c["sliding_window"]}}, "global": {}}
            m.update(layer_types={k: types[k] for k in dict.fromkeys(kinds)}, pattern=layer_pattern(kinds))
        expert = {"kind": "clamped_swiglu", "hidden": c["intermediate_size"], "alpha": float(c["swiglu_alpha"]),
                  "limit": float(c["swiglu_limit"]), "bias": True}
        m["ffn"] = {"kind": "moe", "experts": c["num_local_experts"], "top_k": c["num_experts_per_tok"],
                    "expert": expert, "router": {"kind": "topk_softmax", "bias": True},
                    "balance_loss": c["router_aux_loss_coef"]}
        return recipe

    def rules(self, config: dict, recipe: dict) -> list[Rule]:
        c = self.config(config)
        rules = [r for r in super().rules(config, recipe) if ".ffn." not in r.targets[0]]
        for i in range(c["num_hidden_layers"]):
            b, h = f"decoder.blocks.{i}.", f"model.layers.{i}."
            rules += [Rule(b + "mixer.sinks", (h + "self_attn.sinks",)),
                      Rule(b + "ffn.router.weight", (h + "mlp.router.weight",)),
                      Rule(b + "ffn.router.bias", (h + "mlp.router.bias",))]
            rules += stacked_expert_rules(b + "ffn.", h + "mlp.", c["num_local_experts"])
        return rules

    def export_view(self, recipe: dict) -> dict:
        """LLaMA's checks on a uniform copy: no windows, no sinks, the experts' width as a SwiGLU."""
        m = recipe["model"]
        view = without_layout(m)
        ffn = m["ffn"] if isinstance(m["ffn"], dict) else {}
        view["attention"] = {**m["attention"], "sinks": False, "window": None}
        view["ffn"] = {"kind": "swiglu", "hidden": (ffn.get("expert") or {}).get("hidden"), "bias": False}
        return {**recipe, "model": view}

    def accepts(self, recipe: dict) -> str | None:
        m = recipe["model"]
        if m["kind"] != "decoder_lm":
            return f"model.kind is {m['kind']}, needs decoder_lm"
        plans = layer_plan(m)
        if plans[0].attention is None:
            return "model.attention is null; gpt-oss's attention layers need its settings"
        windows = {p.attention.window for p in plans} - {None}
        alike = [replace(p, type=None, attention=replace(p.attention, window=None)) for p in plans]
        spec = plans[0].ffn or {}
        router, expert = spec.get("router") or {}, spec.get("expert") or {}
        return first_problem(
            (all(p == alike[0] for p in alike), "model.layer_types: gpt-oss's layers differ only in their window"),
            (len(windows) <= 1, "model.layer_types: gpt-oss has one sliding_window"),
            (plans[0].attention.sinks, "model.attention.sinks is false; gpt-oss has a sink per head"),
            (kind_of(spec) == "moe", f"model.ffn is {kind_of(spec)}; gpt-oss has mixtures of experts"),
            (kind_of(router) == "topk_softmax" and router.get("bias"), "model.ffn.router must be topk_softmax with a "
                                                                       "bias"),
            (kind_of(expert) == "clamped_swiglu" and expert.get("bias"), "model.ffn.expert must be clamped_swiglu "
                                                                         "with biases"),
            (spec.get("shared") is None and spec.get("capacity_factor") is None and spec.get("routed_scale") == 1.0,
             "model.ffn: gpt-oss has no shared expert, capacity or routed scale"),
        ) or super().accepts(recipe)

    def family_config(self, model: nn.Module) -> dict:
        plans = layer_plan(model.recipe["model"])
        spec = plans[0].ffn
        window = next((p.attention.window for p in plans if p.attention.window is not None), None)
        return {"attention_bias": plans[0].attention.bias, "sliding_window": window,
                "layer_types": ["sliding_attention" if p.attention.window else "full_attention" for p in plans],
                "num_local_experts": spec["experts"], "num_experts_per_tok": spec["top_k"],
                "swiglu_alpha": spec["expert"]["alpha"], "swiglu_limit": spec["expert"]["limit"],
                "router_aux_loss_coef": spec["balance_loss"]}
