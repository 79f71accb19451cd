"""OLMo 2 (Team OLMo, 2024) <-> ``decoder_lm``: LLaMA's projections and SwiGLU with no pre-norms —
a norm on each sublayer's output before the residual add, x + n(F(x)) (``placement: output``) —
and QK-norm over the whole q and k projections, H·D and K·D features, before the head split and
RoPE (``attention.qk_norm`` with ``qk_norm_scope: projection``).
"""
from __future__ import annotations

from collections.abc import Collection

from torch import nn

import seqzoo
from seqzoo.io.hf import Rule, decoder_problem, first_problem, kind_of, norm

from .llama import LlamaConverter, rope_problem


class Olmo2Converter(LlamaConverter):
    """LLaMA's keys (rms_norm_eps 1e-5, vocab 50304; no mlp_bias)."""

    model_type = "olmo2"
    architecture = "Olmo2ForCausalLM"
    defaults = {**LlamaConverter.defaults, "vocab_size": 50304, "rms_norm_eps": 1e-5}

    def biases(self, c: dict) -> tuple[bool, bool, bool]:
        return c["attention_bias"], c["attention_bias"], False

    def recipe(self, config: dict, names: Collection[str] = ()) -> dict:
        recipe = super().recipe(config, names)
        c = self.config(config)
        model = recipe["model"]
        model["placement"] = "output"
        model["attention"].update(qk_norm={"kind": "rmsnorm", "eps": c["rms_norm_eps"]}, qk_norm_scope="projection")
        return recipe

    def rules(self, config: dict, recipe: dict) -> list[Rule]:
        # LLaMA's rules without its two input norms, then OLMo 2's output and QK norms.
        rules = [rule for rule in super().rules(config, recipe)
                 if not rule.target.endswith((".attn_norm.weight", ".ffn_norm.weight"))]
        for i in range(self.config(config)["num_hidden_layers"]):
            h, b = f"model.layers.{i}.", f"decoder.blocks.{i}."
            rules += norm(b + "attn_out_norm", h + "post_attention_layernorm", bias=False)
            rules += norm(b + "ffn_out_norm", h + "post_feedforward_layernorm", bias=False)
            rules += norm(b + "attn.q_norm", h + "self_attn.q_norm", bias=False)
            rules += norm(b + "attn.k_norm", h + "self_attn.k_norm", bias=False)
        return rules

    def accepts(self, recipe: dict) -> str | None:
        m = recipe["model"]
        problem = decoder_problem(m, position="rope", norm="rmsnorm", ffn_gated=True,
                                  tanh_name="gelu_pytorch_tanh", qk_norm=True, placement="output")
        if problem:
            return problem
        attn = m["attention"]
        head_dim = attn["head_dim"] or m["dim"] // attn["heads"]
        return first_problem(
            (kind_of(attn["score"]) == "scaled_dot" and attn["score"].get("scale") is None,
             "model.attention.score must be scaled_dot with the default scale"),
            (m["embed_norm"] is None, "model.embed_norm is set; OLMo 2 has none"),
            (kind_of(attn["qk_norm"]) == "rmsnorm" and attn["qk_norm_scope"] == "projection"
             and attn["qk_norm"].get("eps") == m["norm"]["eps"],
             "model.attention.qk_norm must be an rmsnorm over the whole projection with model.norm's eps"),
            (attn["window"] is None, "model.attention.window: OLMo 2 has no sliding window"),
            (attn["out_bias"] in (None, attn["bias"]), "model.attention: OLMo 2 has q/k/v and output biases alike"),
            (not m["ffn"]["bias"], "model.ffn: OLMo 2's MLP has no biases"),
        ) or rope_problem(m["position"], m["max_seq_len"], head_dim)

    def family_config(self, model: nn.Module) -> dict:
        return {"attention_bias": model.recipe["model"]["attention"]["bias"]}


@seqzoo.hookimpl
def seqzoo_components():
    return [seqzoo.Component("converter", "olmo2", Olmo2Converter,
                             summary="Hugging Face OLMo 2 <-> decoder_lm (output norms, whole-projection QK-norm)")]
