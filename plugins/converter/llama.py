"""LLaMA (Touvron et al., 2023) <-> ``decoder_lm``: RoPE (rotate-half), RMSNorm, SwiGLU, GQA.

HF's separate q/k/v projections are stacked into seqzoo's fused [q (H·D) | k (K·D) | v (K·D)].
``rope_parameters`` (transformers 5) or the older ``rope_theta`` + ``rope_scaling`` map onto
seqzoo's ``rope`` with a ``rope_scaling`` of kind linear, dynamic, yarn or llama3. Mistral and
Qwen2 subclass this converter and change only their attention.
"""
from __future__ import annotations

from collections.abc import Collection

from torch import nn

import seqzoo
from seqzoo.errors import CheckpointError
from seqzoo.io.hf import (
    CausalLMConverter,
    Rule,
    decoder_problem,
    ffn_activation,
    first_problem,
    fused,
    glu_ffn,
    kind_of,
    linear,
    renamed,
    special_ids,
)

SCALINGS = ("default", "linear", "dynamic", "yarn", "llama3")


def rope_spec(config: dict, head_dim: int, max_positions: int) -> dict:
    """seqzoo's ``rope`` position spec for a LLaMA-style config (either rope format)."""
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if any(isinstance(v, dict) for v in params.values()):
        raise CheckpointError("config.json: rope_parameters per layer type are not supported")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in SCALINGS:
        raise CheckpointError(f"config.json: rope_type {kind!r} is not supported; supported: "
                              f"{', '.join(SCALINGS)}")
    partial = params.get("partial_rotary_factor", config.get("partial_rotary_factor")) or 1.0
    if partial != 1.0:
        raise CheckpointError(f"config.json: partial_rotary_factor {partial} is not supported for "
                              f"{config.get('model_type')} (it rotates whole heads)")
    spec: dict = {"kind": "rope", "base": float(params.get("rope_theta", config.get("rope_theta", 10000.0)))}
    # HF takes L from a top-level original_max_position_embeddings first (Phi-3 style configs).
    original = (config.get("original_max_position_embeddings")
                or params.get("original_max_position_embeddings") or max_positions)
    factor = params.get("factor")
    if kind == "linear":
        spec["scaling"] = {"kind": "linear", "factor": factor}
    elif kind == "dynamic":  # L is max_position_embeddings, seqzoo's default (the model's max_seq_len)
        spec["scaling"] = {"kind": "dynamic", "factor": factor}
    elif kind == "yarn":
        scaling = {"kind": "yarn", "factor": factor if factor is not None else max_positions / original,
                   "original_max_seq_len": original, "beta_fast": params.get("beta_fast") or 32.0,
                   "beta_slow": params.get("beta_slow") or 1.0, "truncate": params.get("truncate", True)}
        if params.get("attention_factor") is not None:
            scaling["attention_factor"] = params["attention_factor"]
        elif params.get("mscale") and params.get("mscale_all_dim"):  # HF uses them only together
            scaling.update(mscale=params["mscale"], mscale_all_dim=params["mscale_all_dim"])
        spec["scaling"] = scaling
    elif kind == "llama3":
        spec["scaling"] = {"kind": "llama3", "factor": factor, "low_freq_factor": params["low_freq_factor"],
                           "high_freq_factor": params["high_freq_factor"], "original_max_seq_len": original}
    return spec


def rope_parameters(position: dict, max_seq_len: int) -> dict:
    """HF ``rope_parameters`` for a resolved seqzoo ``rope`` spec (``rope_problem`` said yes)."""
    out = {"rope_type": "default", "rope_theta": position["base"]}
    scaling = position["scaling"]
    if scaling is None:
        return out
    kind = scaling["kind"]
    out.update(rope_type=kind, factor=scaling["factor"])
    if kind == "yarn":
        out.update(original_max_position_embeddings=scaling["original_max_seq_len"] or max_seq_len,
                   beta_fast=scaling["beta_fast"], beta_slow=scaling["beta_slow"],
                   truncate=scaling["truncate"])
        if scaling["attention_factor"] is not None:
            out["attention_factor"] = scaling["attention_factor"]
        if scaling["mscale"] is not None:
            out.update(mscale=scaling["mscale"], mscale_all_dim=scaling["mscale_all_dim"])
    elif kind == "llama3":
        out.update(low_freq_factor=scaling["low_freq_factor"], high_freq_factor=scaling["high_freq_factor"],
                   original_max_position_embeddings=scaling["original_max_seq_len"])
    return out


def rope_config(position: dict, max_seq_len: int) -> dict:
    """config.json's rope keys: transformers 5's ``rope_parameters``, and the same values in the
    older ``rope_theta`` + ``rope_scaling`` form that transformers 4 reads (5 reads both alike)."""
    params = rope_parameters(position, max_seq_len)
    scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    return {"rope_parameters": params, "rope_theta": params["rope_theta"],
            "rope_scaling": scaling if scaling["rope_type"] != "default" else None}


def rope_problem(position: dict, max_seq_len: int, head_dim: int) -> str | None:
    scaling = position.get("scaling")
    return first_problem(
        (not position.get("interleaved"), "model.position: interleaved rope (HF LLaMA rotates halves)"),
        (position.get("rotary_dim") in (None, head_dim), "model.position.rotary_dim: partial rotary"),
        (scaling is None or scaling["kind"] in SCALINGS,
         f"model.position.scaling {kind_of(scaling)} has no HF rope_type (supported: {', '.join(SCALINGS[1:])})"),
        (kind_of(scaling) != "dynamic" or scaling["original_max_seq_len"] in (None, max_seq_len),
         "model.position.scaling.original_max_seq_len must equal max_seq_len for HF dynamic"),
    )


class LlamaConverter(CausalLMConverter):
    """config.json keys: hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
    num_key_value_heads, head_dim, hidden_act, max_position_embeddings, rms_norm_eps,
    rope_parameters (or rope_theta + rope_scaling), tie_word_embeddings, attention_bias, mlp_bias."""

    model_type = "llama"
    architecture = "LlamaForCausalLM"
    base_prefix = "model."
    embedding = "model.embed_tokens.weight"
    ignored = (r"rotary_emb\.inv_freq$",)
    defaults = {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
                "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": None,
                "head_dim": None, "hidden_act": "silu", "max_position_embeddings": 2048,
                "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_bias": False,
                "mlp_bias": False, "attention_dropout": 0.0, "initializer_range": 0.02}

    #: Where the family's norms sit (``placement``) and its QK-norm's scope, if it has one.
    placement: str = "pre"
    qk_norm_scope: str | None = None

    # -- what differs between LLaMA, Mistral, Qwen2/3 and OLMo 2 ----------------------------------
    def biases(self, c: dict) -> tuple[bool, bool, bool]:
        """(q/k/v bias, o_proj bias, MLP bias)."""
        return c["attention_bias"], c["attention_bias"], c["mlp_bias"]

    def window(self, c: dict) -> int | None:
        return None

    def attention_problem(self, m: dict) -> str | None:
        attn = m["attention"]
        return first_problem(
            (attn["window"] is None, "model.attention.window: LLaMA has no sliding window (Mistral has)"),
            (attn["out_bias"] in (None, attn["bias"]),
             "model.attention: q/k/v and output biases differ (Qwen2 has that)"),
        )

    def family_config(self, model: nn.Module) -> dict:
        m = model.recipe["model"]
        return {"attention_bias": m["attention"]["bias"], "mlp_bias": m["ffn"]["bias"],
                "pretraining_tp": 1}

    # -- the converter interface -------------------------------------------------------------------
    def config(self, config: dict) -> dict:
        c = {**self.defaults, **config}
        c["num_key_value_heads"] = c["num_key_value_heads"] or c["num_attention_heads"]
        c["head_dim"] = c["head_dim"] or c["hidden_size"] // c["num_attention_heads"]
        return c

    def recipe(self, config: dict, names: Collection[str] = ()) -> dict:
        c = self.config(config)
        dim, heads = c["hidden_size"], c["num_attention_heads"]
        qkv_bias, out_bias, mlp_bias = self.biases(c)
        attention = {"heads": heads, "kv_heads": c["num_key_value_heads"], "score": "scaled_dot",
                     "bias": qkv_bias, "out_bias": out_bias, "window": self.window(c),
                     "dropout": c["attention_dropout"]}
        if c["head_dim"] * heads != dim:
            attention["head_dim"] = c["head_dim"]
        if self.qk_norm_scope is not None:
            attention.update(qk_norm={"kind": "rmsnorm", "eps": c["rms_norm_eps"]}, qk_norm_scope=self.qk_norm_scope)
        return {"model": {
            "kind": "decoder_lm", "vocab_size": c["vocab_size"], "dim": dim,
            "layers": c["num_hidden_layers"], "max_seq_len": c["max_position_embeddings"],
            "position": rope_spec(config, c["head_dim"], c["max_position_embeddings"]),
            "norm": {"kind": "rmsnorm", "eps": c["rms_norm_eps"]}, "placement": self.placement,
            "attention": attention, "ffn": glu_ffn(c["hidden_act"], c["intermediate_size"], mlp_bias),
            "tie_embeddings": c["tie_word_embeddings"], "init_std": c["initializer_range"],
        }}

    def rules(self, config: dict, recipe: dict) -> list[Rule]:
        c = self.config(config)
        qkv_bias, out_bias, mlp_bias = self.biases(c)
        q, kv = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
        rules = []
        for i in range(c["num_hidden_layers"]):
            b, h = f"decoder.blocks.{i}.", f"model.layers.{i}."
            rules += renamed(b, h, {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}, False)
            for part in ("weight", "bias") if qkv_bias else ("weight",):
                sources = tuple(f"{h}self_attn.{x}_proj.{part}" for x in "qkv")
                rules.append(fused(f"{b}attn.qkv_proj.{part}", sources, (q, kv, kv)))
            rules += linear(b + "attn.out_proj", h + "self_attn.o_proj", out_bias)
            rules += renamed(b, h, {"ffn.gate": "mlp.gate_proj", "ffn.up": "mlp.up_proj", "ffn.down": "mlp.down_proj"},
                             mlp_bias)
        return rules + self.ends(recipe, "model.norm", False)

    def accepts(self, recipe: dict) -> str | None:
        m = recipe["model"]
        scope = self.qk_norm_scope
        problem = decoder_problem(m, position="rope", norm="rmsnorm", ffn_gated=True,
                                  tanh_name="gelu_pytorch_tanh", qk_norm=scope is not None,
                                  placement=self.placement)
        if problem:
            return problem
        attn = m["attention"]
        head_dim = attn["head_dim"] or m["dim"] // attn["heads"]
        return first_problem(
            (kind_of(attn["score"]) == "scaled_dot" and attn["score"].get("scale") is None,
             "model.attention.score must be scaled_dot with the default scale"),
            (m["embed_norm"] is None, f"model.embed_norm is set; {self.model_type} has none"),
            (scope is None or (kind_of(attn["qk_norm"]) == "rmsnorm" and attn["qk_norm_scope"] == scope
                               and attn["qk_norm"].get("eps") == m["norm"]["eps"]),
             f"model.attention.qk_norm must be an rmsnorm over each {scope} with model.norm's eps"),
        ) or rope_problem(m["position"], m["max_seq_len"], head_dim) or self.attention_problem(m)

    def hf_config(self, model: nn.Module) -> dict:
        m = model.recipe["model"]
        attn = model.decoder.blocks[0].attn
        act, _ = ffn_activation(m["ffn"], "gelu_pytorch_tanh")
        return {"vocab_size": m["vocab_size"], "hidden_size": m["dim"],
                "intermediate_size": model.decoder.blocks[0].ffn.hidden,
                "num_hidden_layers": m["layers"], "num_attention_heads": attn.heads,
                "num_key_value_heads": attn.kv_heads, "head_dim": attn.head_dim, "hidden_act": act,
                "max_position_embeddings": m["max_seq_len"], "rms_norm_eps": m["norm"]["eps"],
                **rope_config(m["position"], m["max_seq_len"]),
                "tie_word_embeddings": m["tie_embeddings"],
                "attention_dropout": m["attention"]["dropout"], "initializer_range": m["init_std"],
                **self.family_config(model), **special_ids(model)}


@seqzoo.hookimpl
def seqzoo_components():
    return [seqzoo.Component("converter", "llama", LlamaConverter,
                             summary="Hugging Face LLaMA <-> decoder_lm (RoPE scalings, GQA, biases)")]
