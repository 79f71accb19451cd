"""What the ``lfm2`` and ``lfm2_moe`` converters share: LFM2's layers, norms, FFN width rule and
tensor names (the family is described in ``lfm2.py``), and their GGUF forms, llama.cpp's ``lfm2`` and
``lfm2moe`` as its converter writes them: conv layers are those with no KV heads
(``attention.head_count_kv`` per layer), the conv kernel [C, 1, L] is stored [C, L], LFM2-MoE's
experts stacked with the expert bias as ``exp_probs_b.bias`` and its sigmoid gating as a key.
llama.cpp's convs have no biases, its q and o are C × C, and its lfm2moe always renormalises the
chosen weights and reads no routed scale: other models are refused."""
from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import replace
from typing import Any, ClassVar

from torch import nn

from seqzoo.builder import LayerPlan, layer_plan
from seqzoo.io.gguf import LLAMA_KEYS, GGUFArch, Key, Transform
from seqzoo.io.gguf.arch import conv_squeezed, heads_fill_width
from seqzoo.io.hf import (
    CausalLMConverter,
    Rule,
    ffn_activation,
    first_problem,
    glu_ffn,
    kind_of,
    linear,
    renamed,
    special_ids,
)
from seqzoo.io.hf.config import HFConfig
from seqzoo.io.hf.rope import rope_config, rope_problem, rope_spec

from ._hybrid import attention_rules, mixer_layout, parts
from ._hybrid_gguf import kv_heads

#: Lfm2Config's defaults (Lfm2MoeConfig's extend them).
DEFAULTS: dict[str, Any] = {
    "vocab_size": 65536, "hidden_size": 2560, "intermediate_size": 12288, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": None, "max_position_embeddings": 128000,
    "initializer_range": 0.02, "norm_eps": 1e-5, "tie_word_embeddings": True, "rope_theta": 1e6, "conv_bias": False,
    "conv_L_cache": 3, "block_multiple_of": 256, "block_ffn_dim_multiplier": 1.0, "block_auto_adjust_ff_dim": True,
    "full_attn_idxs": None, "layer_types": None}
#: Per-layer kinds as config.json's layer_types names them -> the recipe's, and back.
KINDS = {"conv": "conv", "full_attention": "attention"}
NAMED = {"conv": "conv", "attention": "full_attention"}
#: Each layer's norms, the attention layers' q/k norms and the SwiGLU: seqzoo name -> HF name.
NORMS = {"mixer_norm": "operator_norm", "ffn_norm": "ffn_norm"}
QK_NORMS = {"mixer.q_norm": "self_attn.q_layernorm", "mixer.k_norm": "self_attn.k_layernorm"}
SWIGLU = {"gate": "w1", "up": "w3", "down": "w2"}


def ffn_width(c: HFConfig) -> int:
    """The FFN width transformers' Lfm2MLP builds from ``intermediate_size`` and the block_* keys."""
    width = c.positive_int("intermediate_size")
    if c.flag("block_auto_adjust_ff_dim"):
        width = int(2 * width / 3)
        if c["block_ffn_dim_multiplier"] is not None:
            multiple = c.positive_int("block_multiple_of")
            width = int(c.positive_number("block_ffn_dim_multiplier") * width)
            width = multiple * ((width + multiple - 1) // multiple)
        if width < 1:
            raise c.refuse("intermediate_size", "block_auto_adjust_ff_dim makes it 0 wide; give a larger one")
    return width


class Lfm2Family(CausalLMConverter):
    """LFM2's converter, registered as ``lfm2`` (``lfm2.py``) and extended by ``lfm2_moe``."""

    model_type = "lfm2"
    architecture = "Lfm2ForCausalLM"
    named_only = True  # an attention-only stack is Qwen3's too
    base_prefix = "model."
    embedding = "model.embed_tokens.weight"
    ignored = (r"(rotary_emb|pos_emb)\.\w*inv_freq$",)
    defaults: ClassVar[dict[str, Any]] = DEFAULTS
    #: Older names the config class still reads, and wins with: {old: current}.
    legacy: ClassVar[dict[str, str]] = {"tie_embedding": "tie_word_embeddings", "block_ff_dim": "intermediate_size"}

    def config(self, config: dict) -> HFConfig:
        c = HFConfig(config, self.defaults)
        c.update({new: config[old] for old, new in self.legacy.items() if old in config})
        heads = c.positive_int("num_attention_heads")
        c["num_key_value_heads"] = c["num_key_value_heads"] or heads
        c["head_dim"] = c["head_dim"] or c.positive_int("hidden_size") // heads
        c.flag("conv_bias")
        return c

    def layer_kinds(self, c: HFConfig) -> list[str]:
        """``conv`` or ``attention`` for each layer."""
        n = c.positive_int("num_hidden_layers")
        if c["layer_types"] is None:
            attends = range(n) if c["full_attn_idxs"] is None else c.layer_indices("full_attn_idxs", n)
            return ["attention" if i in attends else "conv" for i in range(n)]
        kinds = c["layer_types"]
        if not isinstance(kinds, list) or len(kinds) != n or any(k not in KINDS for k in kinds):
            raise c.refuse("layer_types", f"it must list num_hidden_layers = {n} entries of {' or '.join(KINDS)}")
        return [KINDS[k] for k in kinds]

    def ffn(self, c: HFConfig, kinds: list[str]) -> dict:
        """The model section's FFN keys (``ffn``, and per-layer ones where layers differ)."""
        return {"ffn": glu_ffn("silu", ffn_width(c), False)}

    def recipe(self, config: dict, names: Collection[str] = ()) -> dict:
        c = self.config(config)
        kinds = self.layer_kinds(c)
        dim, heads, head_dim, eps = c["hidden_size"], c["num_attention_heads"], c["head_dim"], c["norm_eps"]
        params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
        params.setdefault("rope_theta", c["rope_theta"])
        position = rope_spec({**config, "rope_parameters": params, "rope_scaling": None}, head_dim,
                             c["max_position_embeddings"])
        attention = {"heads": heads, "kv_heads": c["num_key_value_heads"], "score": "scaled_dot", "bias": False,
                     "window": None, "qk_norm": {"kind": "rmsnorm", "eps": eps}, "qk_norm_scope": "head"}
        if head_dim * heads != dim:
            attention["head_dim"] = head_dim
        model = {"kind": "decoder_lm", "vocab_size": c["vocab_size"], "dim": dim, "layers": len(kinds),
                 "max_seq_len": c["max_position_embeddings"], "position": position,
                 "norm": {"kind": "rmsnorm", "eps": eps}, "placement": "pre", "attention": attention,
                 "tie_embeddings": c.flag("tie_word_embeddings"), "init_std": c["initializer_range"]}
        if "conv" in kinds:
            model["mixer"] = {"kind": "short_conv", "conv": c.positive_int("conv_L_cache"),
                              "conv_bias": c["conv_bias"], "bias": c["conv_bias"]}
        model.update(mixer_layout(kinds), **self.ffn(c, kinds))
        return {"model": model}

    def rules(self, config: dict, recipe: dict) -> list[Rule]:
        m, c = recipe["model"], self.config(config)
        rules = []
        for i, plan in enumerate(layer_plan(m)):
            b, h = f"decoder.blocks.{i}.", f"model.layers.{i}."
            rules += renamed(b, h, NORMS, False)
            if plan.mixer["kind"] == "short_conv":
                rules += renamed(b + "mixer.", h + "conv.", {"in_proj": "in_proj", "out_proj": "out_proj"},
                                 plan.mixer["bias"])
                rules += linear(b + "mixer.conv1d", h + "conv.conv", plan.mixer["conv_bias"])
            else:
                rules += attention_rules(b, h + "self_attn.", plan.attention, m["dim"], out="out_proj", out_bias=False)
                rules += renamed(b, h, QK_NORMS, False)
            rules += self.ffn_rules(b + "ffn.", h + "feed_forward.", plan.ffn, c)
        return rules + self.ends(recipe, "model.embedding_norm", False)

    def ffn_rules(self, ours: str, theirs: str, ffn: dict, c: HFConfig) -> list[Rule]:
        """One layer's FFN (``ours``/``theirs``: its prefixes; ``c``: the config)."""
        return renamed(ours, theirs, SWIGLU, False)

    # -- model -> config.json ------------------------------------------------------------------------
    def ffn_problem(self, plans: list[LayerPlan]) -> str | None:
        """Why the layers' FFNs are not this family's, or None."""
        return first_problem(
            (all(p.ffn == plans[0].ffn for p in plans), "model.layer_types: the FFNs differ between layers; "
                                                        "LFM2 has one"),
            (swiglu(plans[0].ffn), f"model.ffn is {kind_of(plans[0].ffn)}; LFM2's is SwiGLU without biases"),
        )

    def accepts(self, recipe: dict) -> str | None:
        m = recipe["model"]
        if m["kind"] != "decoder_lm":
            return f"model.kind is {m['kind']}, needs decoder_lm"
        plans = layer_plan(m)
        first = plans[0]
        conv, attn = parts(plans, "short_conv")
        kinds = {p.mixer["kind"] for p in plans}
        alike = [replace(p, type=None, mixer={}, ffn=None) for p in plans]  # what must not differ between layers
        head_dim = None if attn is None else attn.head_dim or m["dim"] // attn.heads
        return first_problem(
            (kinds <= {"short_conv", "attention"}, f"model.mixer: layers use {sorted(kinds)}; LFM2's are short_conv "
                                                   f"or attention"),
            (all(p.mixer == conv for p in plans if p.mixer["kind"] == "short_conv"),
             "model.layer_types: the short_conv layers differ; LFM2 has one conv_L_cache and conv_bias"),
            (conv is None or conv["bias"] == conv["conv_bias"],
             "model.mixer: LFM2's conv_bias switches the conv's and the projections' biases together; set bias "
             "equal to conv_bias"),
            (all(p == alike[0] for p in alike),
             "model.layer_types: LFM2's layers differ only in their mixer (short_conv or attention)"),
            (kind_of(first.norm) == "rmsnorm", f"model.norm is {kind_of(first.norm)}, needs rmsnorm"),
            (first.placement == "pre" and first.residual == "sequential" and first.mixer_norm
             and first.residual_multiplier == 1.0,
             "model: LFM2 is pre-norm, its sublayers added in sequence, a norm before every mixer, no multiplier"),
            (kind_of(first.position) == "rope", f"model.position is {kind_of(first.position)}, needs rope"),
            (attn is None or (kind_of(attn.score) == "scaled_dot" and attn.score.get("scale") is None),
             "model.attention.score must be scaled_dot with the default scale"),
            (attn is None or (not attn.bias and not attn.out_bias and attn.window is None and attn.softcap is None
                              and not attn.sinks and not attn.output_gate),
             "model.attention: LFM2's has no biases, window, softcap, sinks or output gate"),
            (attn is None or (kind_of(attn.qk_norm) == "rmsnorm" and attn.qk_norm_scope == "head"
                              and attn.qk_norm.get("eps") == first.norm["eps"]),
             "model.attention.qk_norm must be an rmsnorm over each head with model.norm's eps"),
            (m["embed_norm"] is None and not m["scale_embeddings"] and m["final_softcap"] is None,
             "model: LFM2 has no embedding norm, √C embedding scale or final softcap"),
            (m["embedding_multiplier"] == 1.0 and m["logits_multiplier"] == 1.0,
             "model: LFM2 has no embedding or logits multiplier"),
        ) or self.ffn_problem(plans) or (head_dim is not None and rope_problem(first.position, m["max_seq_len"],
                                                                                head_dim)) or None

    def ffn_config(self, model: nn.Module, plans: list[LayerPlan]) -> dict:
        """config.json's FFN keys."""
        return {"intermediate_size": model.decoder.blocks[0].ffn.hidden, "block_auto_adjust_ff_dim": False}

    def hf_config(self, model: nn.Module) -> dict:
        m = model.recipe["model"]
        plans = layer_plan(m)
        conv, attn = parts(plans, "short_conv")
        head_dim = attn.head_dim or m["dim"] // attn.heads
        return {"vocab_size": m["vocab_size"], "hidden_size": m["dim"], "num_hidden_layers": m["layers"],
                "layer_types": [NAMED["conv" if p.mixer["kind"] == "short_conv" else "attention"] for p in plans],
                "num_attention_heads": attn.heads, "num_key_value_heads": attn.kv_heads or attn.heads,
                "head_dim": head_dim, "max_position_embeddings": m["max_seq_len"], "norm_eps": plans[0].norm["eps"],
                **rope_config(plans[0].position, m["max_seq_len"]),
                "conv_L_cache": conv["conv"] if conv else DEFAULTS["conv_L_cache"],
                "conv_bias": conv["conv_bias"] if conv else False, **self.ffn_config(model, plans),
                "tie_word_embeddings": m["tie_embeddings"], "initializer_range": m["init_std"], **special_ids(model)}


def swiglu(ffn: dict | None) -> bool:
    """Whether a resolved FFN spec is a SwiGLU without biases (LFM2's MLP and experts)."""
    return ffn is not None and ffn_activation(ffn) == ("silu", True) and not ffn.get("bias")


# -- GGUF -----------------------------------------------------------------------------------------
GGUF_KEYS = tuple(k for k in LLAMA_KEYS if k.name != "attention.layer_norm_rms_epsilon") + (
    Key("attention.layer_norm_rms_epsilon", "norm_eps", "f32"), Key("shortconv.l_cache", "conv_L_cache"))


def gguf_metadata(c: Mapping) -> dict:
    return {"attention.head_count_kv": kv_heads(c, [KINDS[k] == "attention" for k in c["layer_types"]])}


def gguf_config(get) -> dict:
    kv = list(get("attention.head_count_kv"))
    return {"layer_types": [NAMED["attention" if k else "conv"] for k in kv], "conv_bias": False,
            "num_key_value_heads": max(kv) or get("attention.head_count"), "block_auto_adjust_ff_dim": False}


def gguf_problem(c: Mapping) -> str | None:
    if c.get("conv_bias"):
        return "llama.cpp's LFM2 short convs have no biases; this model has them (conv_bias)"
    if not c.get("norm_topk_prob", True):
        return "llama.cpp's lfm2moe renormalises the top-k routing weights; this model does not (norm_topk_prob)"
    if c.get("routed_scaling_factor", 1.0) != 1.0:
        return (f"llama.cpp's lfm2moe reads no routed scale; this model scales its experts by "
                f"{c['routed_scaling_factor']} (routed_scaling_factor)")
    return heads_fill_width(c)


GGUF_TRANSFORMS = (Transform(r"conv\.conv\.weight$", conv_squeezed),)
LFM2 = GGUFArch("lfm2", keys=GGUF_KEYS, transforms=GGUF_TRANSFORMS, export=gguf_metadata, config=gguf_config,
                problem=gguf_problem)
LFM2MOE = GGUFArch(
    "lfm2moe", keys=GGUF_KEYS + (Key("expert_count", "num_experts"), Key("expert_used_count", "num_experts_per_tok"),
                                 Key("expert_feed_forward_length", "moe_intermediate_size"),
                                 Key("leading_dense_block_count", "num_dense_layers", default=0)),
    transforms=GGUF_TRANSFORMS, export=gguf_metadata, problem=gguf_problem,
    fixed={"expert_gating_func": 2},  # sigmoid, as llama.cpp's converter writes it
    config=lambda get: {**gguf_config(get), "use_expert_bias": True, "norm_topk_prob": True,
                        "routed_scaling_factor": 1.0},
    renames={r"^model\.(layers\.\d+\.feed_forward\.experts\.)": r"\1", r"\.expert_bias$": ".expert_bias.bias"})
