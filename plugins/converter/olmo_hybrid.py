"""OLMo-Hybrid (Ai2, 2026) <-> ``decoder_lm``: gated-delta layers and OLMo 3 attention layers, each
with a SwiGLU FFN, in two norm placements:

- ``linear_attention`` layers are pre-norm, LLaMA's way: x + mixer(n₁(x)), then + FFN(n₂(·));
- ``full_attention`` layers are OLMo 2's, norms on each sublayer's output before the residual add:
  x + n₁(attention(x)), then + n₂(FFN(·)) (``placement: output``), with QK-norm over the whole q
  and k projections before the head split (``qk_norm_scope: projection``).

The kinds come from ``layer_types`` (default: full attention at every fourth layer, the last one
when there are fewer than four), and are layer types of the recipe in the shortest repeating
``pattern``. RMSNorm is the plain one (weight · x̂) at ``rms_norm_eps``; RoPE rotates whole heads of
C / H (``head_dim`` when config.json names one), or nothing when ``rope_theta`` is null (NoPE).

The gated-delta layers (``gated_deltanet``, ``_gated_delta``'s ``separate`` layout) take their
shape from the ``linear_*`` keys, β = 2σ(b) when ``linear_allow_neg_eigval`` (true by default),
and fix their gated norm's ε at 10⁻⁵; ``linear_a_log_*``, ``linear_dt_*`` only initialise them.
Checkpoints name the norms as OLMo-core does, which transformers renames on load: a delta layer's
``attention_layer_norm`` and ``feedforward_layer_norm`` are its two pre-norms, an attention layer's
``feedforward_layer_norm`` and ``post_feedforward_layernorm`` its two output norms.
"""
from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

from torch import nn

from seqzoo.builder import layer_plan
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
from seqzoo.io.hf.rope import rope_config, rope_problem, rope_spec
from seqzoo.registry import builtin

from ._gated_delta import (
    FULL,
    GLU,
    LINEAR,
    attention_problem,
    attention_rules,
    layer_kinds,
    mixer_config,
    mixer_problem,
    mixer_rules,
    mixer_spec,
    model_problem,
)

NORM_EPS = 1e-5  # the gated-delta layers' o_norm, whatever rms_norm_eps says
#: Each kind of layer's norms: seqzoo name -> the checkpoint's name under ``model.layers.i.``.
NORMS = {LINEAR: {"mixer_norm": "attention_layer_norm", "ffn_norm": "feedforward_layer_norm"},
         FULL: {"mixer_out_norm": "feedforward_layer_norm", "ffn_out_norm": "post_feedforward_layernorm"}}
#: OlmoHybridConfig's defaults.
DEFAULTS = {"vocab_size": 100352, "hidden_size": 3840, "intermediate_size": 11008, "num_hidden_layers": 32,
            "num_attention_heads": 30, "num_key_value_heads": None, "head_dim": None, "hidden_act": "silu",
            "max_position_embeddings": 65536, "initializer_range": 0.02, "rms_norm_eps": 1e-6,
            "tie_word_embeddings": False, "attention_bias": False, "attention_dropout": 0.0, "layer_types": None,
            "linear_num_key_heads": None, "linear_num_value_heads": None, "linear_key_head_dim": None,
            "linear_value_head_dim": None, "linear_conv_kernel_dim": 4, "linear_allow_neg_eigval": True}


def every_fourth(n: int) -> list[str]:
    """OlmoHybridConfig's kinds when config.json lists none."""
    kinds = [FULL if i % 4 == 3 else LINEAR for i in range(n)]
    return kinds if FULL in kinds else [*kinds[:-1], FULL]


@builtin("Hugging Face OLMo-Hybrid <-> decoder_lm (pre-norm gated DeltaNet layers, OLMo 2 output-norm attention "
         "layers)")
class OlmoHybridConverter(CausalLMConverter):
    """config.json keys: LLaMA's (hidden_size, intermediate_size, num_hidden_layers,
    num_attention_heads, num_key_value_heads, hidden_act, max_position_embeddings, rms_norm_eps,
    rope_parameters, attention_bias, tie_word_embeddings), layer_types, the linear_* keys and
    linear_allow_neg_eigval."""

    model_type = "olmo_hybrid"
    architecture = "OlmoHybridForCausalLM"
    base_prefix = "model."
    embedding = "model.embed_tokens.weight"
    ignored = (r"rotary_emb\.\w*inv_freq$",)

    def config(self, config: dict) -> HFConfig:
        c = HFConfig(config, DEFAULTS)
        heads = c.positive_int("num_attention_heads")
        c["num_key_value_heads"] = c["num_key_value_heads"] or heads
        c["head_dim"] = c["head_dim"] or c["hidden_size"] // heads
        # OlmoHybridConfig fills the linear shape from the attention's when config.json leaves it out.
        c["linear_num_key_heads"] = c["linear_num_key_heads"] or heads
        c["linear_num_value_heads"] = c["linear_num_value_heads"] or heads
        c["linear_key_head_dim"] = c["linear_key_head_dim"] or int(0.75 * c["hidden_size"] / c["linear_num_key_heads"])
        c["linear_value_head_dim"] = c["linear_value_head_dim"] or 2 * c["linear_key_head_dim"]
        c.flag("linear_allow_neg_eigval")
        return c

    def recipe(self, config: dict, names: Collection[str] = ()) -> dict:
        c = self.config(config)
        kinds = layer_kinds(c, every_fourth)
        dim, heads, head_dim, eps = c["hidden_size"], c["num_attention_heads"], c["head_dim"], c["rms_norm_eps"]
        params = config.get("rope_parameters") or config.get("rope_scaling") or {}
        nope = params.get("rope_theta", config.get("rope_theta", 0.0)) is None
        position = "none" if nope else rope_spec(config, head_dim, c["max_position_embeddings"])
        attention = {"heads": heads, "kv_heads": c["num_key_value_heads"], "score": "scaled_dot",
                     "bias": c["attention_bias"], "window": None,
                     "dropout": c["attention_dropout"], "qk_norm": {"kind": "rmsnorm", "eps": eps},
                     "qk_norm_scope": "projection"}
        if head_dim * heads != dim:
            attention["head_dim"] = head_dim
        types = {LINEAR: {}, FULL: {"mixer": "attention", "placement": "output"}}
        return {"model": {
            "kind": "decoder_lm", "vocab_size": c["vocab_size"], "dim": dim, "layers": c["num_hidden_layers"],
            "max_seq_len": c["max_position_embeddings"], "position": position, "norm": {"kind": "rmsnorm", "eps": eps},
            "placement": "pre", "attention": attention,
            "mixer": mixer_spec(c, norm_eps=NORM_EPS, allow_neg_eigval=c["linear_allow_neg_eigval"]),
            "ffn": glu_ffn("silu", c.positive_int("intermediate_size"), False),
            "layer_types": {k: types[k] for k in dict.fromkeys(kinds)}, "pattern": layer_pattern(kinds),
            "tie_embeddings": c["tie_word_embeddings"], "init_std": c["initializer_range"]}}

    def rules(self, config: dict, recipe: dict) -> list[Rule]:
        m = recipe["model"]
        rules = []
        for i, plan in enumerate(layer_plan(m)):
            b, h = f"decoder.blocks.{i}.", f"model.layers.{i}."
            if plan.mixer["kind"] == "gated_deltanet":
                rules += renamed(b, h, NORMS[LINEAR], False)
                rules += mixer_rules(b + "mixer.", h + "linear_attn.", plan.mixer, m["dim"], "separate")
            else:
                rules += renamed(b, h, NORMS[FULL], False)
                rules += attention_rules(b + "mixer.", h + "self_attn.", plan.attention, m["dim"])
            rules += renamed(b + "ffn.", h + "mlp.", GLU, False)
        return rules + self.ends(recipe, "model.norm", False)

    def accepts(self, recipe: dict) -> str | None:
        m = recipe["model"]
        if m["kind"] != "decoder_lm":
            return f"model.kind is {m['kind']}, needs decoder_lm"
        plans = layer_plan(m)
        first = plans[0]
        deltas = [p for p in plans if p.mixer["kind"] == "gated_deltanet"]
        attends = [p for p in plans if p.mixer["kind"] == "attention"]
        alike = [replace(p, type=None, mixer={}, placement="pre") for p in plans]
        attn, eps = (attends or plans)[0].attention, first.norm.get("eps")
        head_dim = (attn.head_dim or m["dim"] // attn.heads) if attn else None
        return first_problem(
            (len(deltas) + len(attends) == len(plans) and deltas and attends,
             "model.mixer: OLMo-Hybrid has gated_deltanet and attention layers, at least one of each"),
            (all(p.mixer == deltas[0].mixer for p in deltas), "model.layer_types: the gated-delta layers differ"),
            (all(p.placement == "pre" for p in deltas) and all(p.placement == "output" for p in attends),
             "model.placement: OLMo-Hybrid's gated-delta layers are pre-norm, its attention layers output-norm"),
            (all(p == alike[0] for p in alike),
             "model.layer_types: OLMo-Hybrid's layers differ only in their mixer and norm placement"),
            (kind_of(first.norm) == "rmsnorm", f"model.norm is {kind_of(first.norm)}, needs rmsnorm"),
            (first.residual == "sequential" and first.mixer_norm and first.residual_multiplier == 1.0,
             "model: OLMo-Hybrid adds its sublayers in sequence, unscaled, with every norm"),
            (first.ffn is not None and ffn_activation(first.ffn) == ("silu", True) and not first.ffn["bias"],
             "model.ffn must be swiglu without biases"),
            (kind_of(first.position) in ("rope", "none"), f"model.position is {kind_of(first.position)}, needs "
                                                          f"rope or none"),
        ) or attention_problem(attn, "OLMo-Hybrid", qk_norm="rmsnorm", scope="projection", eps=eps, gated=False) \
            or (rope_problem(first.position, m["max_seq_len"], head_dim) if kind_of(first.position) == "rope"
                else None) \
            or mixer_problem(deltas[0].mixer, "OLMo-Hybrid", norm_eps=NORM_EPS, allow_neg_eigval=None,
                             eps_source="OLMo-Hybrid's o_norm") or model_problem(m, "OLMo-Hybrid")

    def hf_config(self, model: nn.Module) -> dict:
        m = model.recipe["model"]
        plans = layer_plan(m)
        first = plans[0]
        attn = next(p.attention for p in plans if p.mixer["kind"] == "attention")
        delta = next(p.mixer for p in plans if p.mixer["kind"] == "gated_deltanet")
        head_dim = attn.head_dim or m["dim"] // attn.heads
        if kind_of(first.position) == "rope":
            rope = rope_config(first.position, m["max_seq_len"])
        else:  # NoPE: transformers builds no rotary embedding when rope_theta is null
            rope = {"rope_parameters": {"rope_type": "default", "rope_theta": None}}
        return {"vocab_size": m["vocab_size"], "hidden_size": m["dim"],
                "intermediate_size": model.decoder.blocks[0].ffn.hidden, "num_hidden_layers": m["layers"],
                "num_attention_heads": attn.heads,
                "num_key_value_heads": attn.kv_heads or attn.heads,
                **({"head_dim": head_dim} if head_dim * attn.heads != m["dim"] else {}), "hidden_act": "silu",
                "max_position_embeddings": m["max_seq_len"], "rms_norm_eps": first.norm["eps"], **rope,
                "attention_bias": attn.bias, "attention_dropout": attn.dropout,
                "layer_types": [LINEAR if p.mixer["kind"] == "gated_deltanet" else FULL for p in plans],
                **mixer_config(delta, m["dim"]), "linear_allow_neg_eigval": delta["allow_neg_eigval"],
                "tie_word_embeddings": m["tie_embeddings"], "initializer_range": m["init_std"],
                **special_ids(model)}
