"""Bamba (IBM, Princeton and UIUC, 2024) <-> ``decoder_lm``: a hybrid of Mamba-2 and attention
layers, each with a SwiGLU FFN: x + mixer(n₁(x)), then + FFN(n₂(·)), RMSNorm throughout.

Layer i attends iff i is in ``attn_layer_indices`` (transformers' ``layers_block_type``), else it
is a Mamba-2 mixer. The recipe's mixer is ``mamba2`` and the attention layers are a layer type
``{mixer: attention}`` in the shortest ``pattern`` that repeats into the per-layer list (5 layers
with attention at 2 -> [mamba, mamba, attention]). The attention is LLaMA's (GQA, ``attention_bias``
on q/k/v/o, RoPE rotating halves) with a partial rotary: BambaConfig hard-codes
``partial_rotary_factor`` 0.5 unless ``rope_parameters`` names one, so exports always name it.

The Mamba-2 mixer is Mamba2's under ``mamba_*`` names (``mamba_n_heads``, ``mamba_d_head`` "auto" =
expand·C / heads, ``mamba_n_groups``, ``mamba_d_state``, ``mamba_d_conv``, ``mamba_expand``,
``mamba_chunk_size``, ``mamba_conv_bias``, ``mamba_proj_bias``, ``time_step_limit``); its gated
norm normalises groups of E / G with ``rms_norm_eps`` like every other norm, and it takes its
activation from ``hidden_act``, so that must be silu. Padding and the decode-step Δ clamp differ
from transformers as for Mamba-2 (see ``mamba2``); Bamba has no ``residual_in_fp32``.
"""
from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

from torch import nn

from seqzoo.builder import layer_plan
from seqzoo.errors import CheckpointError
from seqzoo.io.hf import (
    CausalLMConverter,
    Rule,
    ffn_activation,
    first_problem,
    glu_ffn,
    kind_of,
    layer_pattern,
    renamed,
    special_ids,
)
from seqzoo.io.hf.config import HFConfig
from seqzoo.io.hf.rope import partial_factor, rope_config, rope_problem, rope_spec
from seqzoo.registry import builtin

from ._hybrid import attention_rules
from ._mamba2 import MAMBA_PREFIXED as NAMES
from ._mamba2 import NO_LIMIT, mixer_config, mixer_problem, mixer_rules, mixer_spec

#: Per-layer kinds as transformers names them (``layers_block_type``) and as the recipe does.
KINDS = {"full_attention": "attention", "linear_attention": "mamba"}
PARTIAL = 0.5  # BambaConfig's partial_rotary_factor when rope_parameters names none


@builtin("Hugging Face Bamba <-> decoder_lm (Mamba-2 and attention layers by attn_layer_indices, SwiGLU "
         "everywhere, partial RoPE)")
class BambaConverter(CausalLMConverter):
    """config.json keys: LLaMA's (hidden_size, intermediate_size, num_hidden_layers,
    num_attention_heads, num_key_value_heads, head_dim, hidden_act, max_position_embeddings,
    rms_norm_eps, rope_parameters, attention_bias, mlp_bias, tie_word_embeddings) plus
    attn_layer_indices, the mamba_* options and time_step_limit; num_logits_to_keep and
    z_loss_coefficient change nothing seqzoo computes."""

    model_type = "bamba"
    architecture = "BambaForCausalLM"
    base_prefix = "model."
    embedding = "model.embed_tokens.weight"
    ignored = (r"rotary_emb\.\w*inv_freq$",)
    defaults = {"vocab_size": 128000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": None, "hidden_act": "silu",
                "initializer_range": 0.02, "rms_norm_eps": 1e-5, "max_position_embeddings": 262144,
                "attention_dropout": 0.0, "attn_layer_indices": None, "mamba_n_heads": 128, "mamba_d_head": "auto",
                "mamba_n_groups": 1, "mamba_d_state": 256, "mamba_d_conv": 4, "mamba_expand": 2,
                "mamba_chunk_size": 256, "mamba_conv_bias": True, "mamba_proj_bias": False,
                "time_step_limit": NO_LIMIT, "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False}

    def config(self, config: dict) -> dict:
        c = HFConfig(config, self.defaults)
        c["num_key_value_heads"] = c["num_key_value_heads"] or c["num_attention_heads"]
        c["head_dim"] = c["head_dim"] or c["hidden_size"] // c["num_attention_heads"]
        if c["mamba_d_head"] == "auto":
            c["mamba_d_head"] = c["mamba_expand"] * c["hidden_size"] // c["mamba_n_heads"]
        if c["hidden_act"] != "silu":
            raise CheckpointError(f"config.json: hidden_act {c['hidden_act']!r} is not supported for bamba; its "
                                  f"Mamba-2 mixers and SwiGLU take their activation from it and seqzoo's use silu")
        if c["time_step_limit"] is None:  # transformers' PyTorch path cannot run it either
            raise CheckpointError("config.json: time_step_limit None is not supported; write [0.0, Infinity] "
                                  "for no limit")
        return c

    def layer_kinds(self, c: dict) -> list[str]:
        """``mamba`` or ``attention`` for each layer, as BambaConfig.layers_block_type reads them."""
        n = c["num_hidden_layers"]
        indices = c.layer_indices("attn_layer_indices", n)
        kinds = ["attention" if i in indices else "mamba" for i in range(n)]
        for key in ("layers_block_type", "layer_types"):  # derived, not stored; a stored copy must agree
            if key in c and [KINDS.get(k, k) for k in c[key] or []] != kinds:
                raise CheckpointError(f"config.json: {key} {c[key]!r} disagrees with attn_layer_indices "
                                      f"{c['attn_layer_indices']!r}, which decides each layer's kind")
        return kinds

    def recipe(self, config: dict, names: Collection[str] = ()) -> dict:
        c = self.config(config)
        kinds = self.layer_kinds(c)
        dim, heads, head_dim, eps = c["hidden_size"], c["num_attention_heads"], c["head_dim"], c["rms_norm_eps"]
        params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
        params.setdefault("partial_rotary_factor", PARTIAL)
        position = rope_spec({**config, "rope_parameters": params, "rope_scaling": None}, head_dim,
                             c["max_position_embeddings"], partial=True)
        attention = {"heads": heads, "kv_heads": c["num_key_value_heads"], "score": "scaled_dot",
                     "bias": c["attention_bias"], "out_bias": c["attention_bias"], "window": None,
                     "dropout": c["attention_dropout"]}
        if head_dim * heads != dim:
            attention["head_dim"] = head_dim
        model = {"kind": "decoder_lm", "vocab_size": c["vocab_size"], "dim": dim, "layers": c["num_hidden_layers"],
                 "max_seq_len": c["max_position_embeddings"], "position": position,
                 "norm": {"kind": "rmsnorm", "eps": eps}, "placement": "pre", "attention": attention,
                 "mixer": mixer_spec(c, NAMES, dim, eps), "ffn": glu_ffn("silu", c["intermediate_size"], c["mlp_bias"]),
                 "tie_embeddings": c["tie_word_embeddings"], "init_std": c["initializer_range"]}
        if "attention" in kinds:
            types = {"mamba": {}, "attention": {"mixer": "attention"}}
            model.update(layer_types={k: types[k] for k in dict.fromkeys(kinds)}, pattern=layer_pattern(kinds))
        return {"model": model}

    def rules(self, config: dict, recipe: dict) -> list[Rule]:
        m = recipe["model"]
        rules = []
        for i, plan in enumerate(layer_plan(m)):
            b, h = f"decoder.blocks.{i}.", f"model.layers.{i}."
            rules += renamed(b, h, {"mixer_norm": "input_layernorm", "ffn_norm": "pre_ff_layernorm"}, False)
            if plan.mixer["kind"] == "mamba2":
                rules += mixer_rules(b + "mixer.", h + "mamba.", plan.mixer)
            else:
                rules += attention_rules(b, h + "self_attn.", plan.attention, m["dim"], out="o_proj",
                                         out_bias=plan.attention.bias)
            rules += renamed(b, h, {f"ffn.{x}": f"feed_forward.{x}_proj" for x in ("gate", "up", "down")},
                             plan.ffn["bias"])
        return rules + self.ends(recipe, "model.final_layernorm", False)

    @staticmethod
    def mamba_spec(m: dict, plans: list) -> dict | None:
        """The Mamba-2 layers' mixer spec (the model's own when every layer attends), or None."""
        found = next((p.mixer for p in plans if p.mixer["kind"] == "mamba2"), None)
        if found is None and kind_of(m.get("mixer")) == "mamba2" and isinstance(m["mixer"], dict):
            found = m["mixer"]
        return found

    def accepts(self, recipe: dict) -> str | None:
        m = recipe["model"]
        if m["kind"] != "decoder_lm":
            return f"model.kind is {m['kind']}, needs decoder_lm"
        plans = layer_plan(m)
        if plans[0].attention is None:
            return "model.attention is null; Bamba's attention layers need its settings"
        first, spec = plans[0], self.mamba_spec(m, plans)
        attn = first.attention
        head_dim = attn.head_dim or m["dim"] // attn.heads
        kinds = {p.mixer["kind"] for p in plans}
        alike = [replace(p, type=None, mixer={}) for p in plans]  # what must not differ between layers
        return first_problem(
            (kinds <= {"mamba2", "attention"}, f"model.mixer: layers use {sorted(kinds)}; Bamba's are mamba2 "
                                               f"or attention"),
            (spec is not None, "model.mixer is not mamba2; Bamba's non-attention layers are Mamba-2"),
            (all(p.mixer == spec for p in plans if p.mixer["kind"] == "mamba2"),
             "model.layer_types: the Mamba-2 layers differ; Bamba has one set of mamba_* options"),
            (all(p == alike[0] for p in alike),
             "model.layer_types: Bamba's layers differ only in their mixer (mamba2 or attention)"),
            (first.ffn is not None and ffn_activation(first.ffn) == ("silu", True),
             f"model.ffn is {kind_of(first.ffn)}, needs swiglu (Bamba's MLP is SwiGLU)"),
            (kind_of(first.norm) == "rmsnorm", f"model.norm is {kind_of(first.norm)}, needs rmsnorm"),
            (first.placement == "pre", f"model.placement is {first.placement}, needs pre"),
            (first.residual == "sequential", f"model.residual is {first.residual}, needs sequential"),
            (first.mixer_norm, "model.layer_types: mixer_norm false; every Bamba layer has input_layernorm"),
            (kind_of(first.position) == "rope", f"model.position is {kind_of(first.position)}, needs rope"),
            (kind_of(attn.score) == "scaled_dot" and attn.score.get("scale") is None,
             "model.attention.score must be scaled_dot with the default scale"),
            (attn.out_bias in (None, attn.bias), "model.attention: q/k/v and output biases differ; Bamba's agree"),
            (attn.window is None, "model.attention.window: Bamba has no sliding window"),
            (attn.qk_norm is None, "model.attention.qk_norm is set; Bamba has none"),
            (attn.softcap is None, "model.attention.softcap is set; Bamba has none"),
            (not attn.sinks, "model.attention.sinks is set; Bamba has none"),
            (not attn.output_gate, "model.attention.output_gate is set; Bamba has none"),
            (m["embed_norm"] is None, "model.embed_norm is set; Bamba has none"),
            (not m["scale_embeddings"], "model.scale_embeddings is true; Bamba has none"),
            (m["final_softcap"] is None, "model.final_softcap is set; Bamba has none"),
        ) or rope_problem(first.position, m["max_seq_len"], head_dim, partial=True) \
            or mixer_problem(spec, first.norm["eps"], "Bamba")

    def hf_config(self, model: nn.Module) -> dict:
        m = model.recipe["model"]
        plans = layer_plan(m)
        first = plans[0]
        attn, spec = first.attention, self.mamba_spec(m, plans)
        head_dim = attn.head_dim or m["dim"] // attn.heads
        rope = rope_config(first.position, m["max_seq_len"])
        factor = partial_factor(first.position.get("rotary_dim") or head_dim, head_dim)
        for key in ("rope_parameters", "rope_scaling"):  # name it: BambaConfig's default is 0.5
            if rope[key] is not None:
                rope[key]["partial_rotary_factor"] = factor
        return {"vocab_size": m["vocab_size"], "hidden_size": m["dim"],
                "intermediate_size": model.decoder.blocks[0].ffn.hidden, "num_hidden_layers": m["layers"],
                "num_attention_heads": attn.heads, "num_key_value_heads": attn.kv_heads or attn.heads,
                "head_dim": head_dim, "hidden_act": "silu", "max_position_embeddings": m["max_seq_len"],
                "rms_norm_eps": first.norm["eps"], **rope, "attention_bias": attn.bias,
                "mlp_bias": first.ffn["bias"], "attention_dropout": attn.dropout,
                "attn_layer_indices": [i for i, p in enumerate(plans) if p.mixer["kind"] == "attention"],
                **mixer_config(spec, NAMES, m["dim"]), "tie_word_embeddings": m["tie_embeddings"],
                "initializer_range": m["init_std"], **special_ids(model)}
