"""Qwen3 (Qwen team, 2025) <-> ``decoder_lm``: Qwen2's layout with no q/k/v biases and a QK-norm
— an RMSNorm over each head's D features of q and of k (one weight of D shared by the heads),
after the projection and before RoPE (``attention.qk_norm`` with ``qk_norm_scope: head``).

Its configs give ``head_dim`` explicitly (128 unless set), which need not be ``hidden_size / heads``.
"""
from __future__ import annotations

from collections.abc import Collection

from torch import nn

import seqzoo
from seqzoo.io.hf import Rule, decoder_problem, first_problem, kind_of, norm

from .llama import rope_problem
from .qwen2 import Qwen2Converter


class Qwen3Converter(Qwen2Converter):
    """Qwen2's keys plus attention_bias (false) and head_dim (128)."""

    model_type = "qwen3"
    architecture = "Qwen3ForCausalLM"
    defaults = {**Qwen2Converter.defaults, "head_dim": 128, "attention_bias": False}

    def biases(self, c: dict) -> tuple[bool, bool, bool]:
        return c["attention_bias"], c["attention_bias"], False

    def recipe(self, config: dict, names: Collection[str] = ()) -> dict:
        recipe = super().recipe(config, names)
        c = self.config(config)
        recipe["model"]["attention"]["qk_norm"] = {"kind": "rmsnorm", "eps": c["rms_norm_eps"]}
        return recipe

    def rules(self, config: dict, recipe: dict) -> list[Rule]:
        rules = super().rules(config, recipe)
        for i in range(self.config(config)["num_hidden_layers"]):
            h, b = f"model.layers.{i}.self_attn.", f"decoder.blocks.{i}.attn."
            rules += norm(b + "q_norm", h + "q_norm", bias=False) + norm(b + "k_norm", h + "k_norm", bias=False)
        return rules

    def accepts(self, recipe: dict) -> str | None:
        m = recipe["model"]
        problem = decoder_problem(m, position="rope", norm="rmsnorm", ffn_gated=True,
                                  tanh_name="gelu_pytorch_tanh", qk_norm=True)
        if problem:
            return problem
        attn = m["attention"]
        head_dim = attn["head_dim"] or m["dim"] // attn["heads"]
        return first_problem(
            (kind_of(attn["score"]) == "scaled_dot" and attn["score"].get("scale") is None,
             "model.attention.score must be scaled_dot with the default scale"),
            (m["embed_norm"] is None, "model.embed_norm is set; Qwen3 has none"),
            (kind_of(attn["qk_norm"]) == "rmsnorm" and attn["qk_norm_scope"] == "head"
             and attn["qk_norm"].get("eps") == m["norm"]["eps"],
             "model.attention.qk_norm must be a per-head rmsnorm with model.norm's eps"),
            (attn["out_bias"] in (None, attn["bias"]), "model.attention: Qwen3 has q/k/v and output biases alike"),
            (not m["ffn"]["bias"], "model.ffn: Qwen3's MLP has no biases"),
        ) or rope_problem(m["position"], m["max_seq_len"], head_dim)

    def family_config(self, model: nn.Module) -> dict:
        return {**super().family_config(model), "attention_bias": model.recipe["model"]["attention"]["bias"]}


@seqzoo.hookimpl
def seqzoo_components():
    return [seqzoo.Component("converter", "qwen3", Qwen3Converter,
                             summary="Hugging Face Qwen3 <-> decoder_lm (per-head QK RMSNorm, no q/k/v biases)")]
