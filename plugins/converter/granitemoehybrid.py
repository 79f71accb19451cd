"""Granite 4.0-H (IBM, 2025) <-> ``decoder_lm``: Bamba's Mamba-2 and attention layers, each with a
SwiGLU FFN that is a mixture of experts plus a shared expert (or the shared expert alone), under
Granite's μP multipliers; pre-norm RMSNorm throughout.

    h₀ = m_e · E[ids]                                        m_e: embedding_multiplier
    h ← h + m_r · mixer(n₁(h));  h ← h + m_r · FFN(n₂(h))    m_r: residual_multiplier
    logits = W h / s                                         s: logits_scaling (logits_multiplier 1/s)

- Layers: ``layer_types`` (``mamba`` / ``attention``, or transformers 5's ``linear_attention`` /
  ``full_attention``; all Mamba when absent), as layer types in the shortest repeating ``pattern``.
- Mamba-2: Bamba's (``mamba_*`` options, ``time_step_limit``; the gated norm over E / G channels
  with ``rms_norm_eps``; ``hidden_act`` is its activation, so it must be silu), see ``bamba``.
- Attention: GQA with ``attention_bias`` on q/k/v/o; its score scale is ``attention_multiplier``
  (not 1/√D). ``position_embedding_type`` "rope" rotates whole heads (``rope_parameters``); anything
  else is NoPE, as in every released H model ("nope").
- FFN: ``shared_mlp.input_linear`` holds the shared expert's [gate | up] rows (``shared_intermediate_size``
  each), ``output_linear`` its down projection. With ``num_local_experts`` > 0 the layer adds a
  ``block_sparse_moe``: ``router.layer`` picks the top ``num_experts_per_tok`` logits and softmaxes
  over them (``topk_softmax``); ``input_linear`` (E, 2F, C) and ``output_linear`` (E, C, F) are
  seqzoo's stacked ``experts.gate_up`` / ``experts.down`` as they are. With 0 experts the shared
  expert is the layer's dense SwiGLU.

Exports write the legacy ``mamba`` / ``attention`` layer names the published configs use (which
transformers 5 reads as its own).
"""
from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

from torch import nn

from seqzoo.builder import layer_plan
from seqzoo.io.hf import (
    CausalLMConverter,
    Rule,
    copy,
    ffn_activation,
    first_problem,
    glu_ffn,
    kind_of,
    layer_pattern,
    renamed,
    special_ids,
    split,
)
from seqzoo.io.hf.config import HFConfig
from seqzoo.io.hf.rope import rope_config, rope_problem, rope_spec
from seqzoo.registry import builtin

from ._hybrid import attention_rules
from ._hybrid_gguf import GRANITE_HYBRID
from ._mamba2 import MAMBA_PREFIXED as NAMES
from ._mamba2 import NO_LIMIT, mixer_config, mixer_problem, mixer_rules, mixer_spec

#: Per-layer kinds as config.json names them (legacy names, and transformers 5's) -> the recipe's.
KINDS = {"mamba": "mamba", "linear_attention": "mamba", "attention": "attention", "full_attention": "attention"}


def scale_of(value: float) -> float:
    """1 / value, as a config writes it (1 / (1/3) is 3.0, not 2.9999999999999996)."""
    return float(f"{1.0 / value:.15g}")


@builtin("Hugging Face Granite 4.0-H <-> decoder_lm (Mamba-2 and attention layers, experts with a shared one, "
         "μP multipliers)")
class GraniteMoeHybridConverter(CausalLMConverter):
    """config.json keys: hidden_size, intermediate_size (an expert's width), shared_intermediate_size,
    num_hidden_layers, layer_types, num_attention_heads, num_key_value_heads, head_dim, hidden_act,
    max_position_embeddings, rms_norm_eps, attention_bias, attention_dropout, position_embedding_type,
    rope_parameters, embedding_multiplier, residual_multiplier, attention_multiplier, logits_scaling,
    num_local_experts, num_experts_per_tok, router_aux_loss_coef, the mamba_* options,
    time_step_limit, tie_word_embeddings; init_method and normalization_function change nothing
    transformers computes."""

    model_type = "granitemoehybrid"
    named_only = True  # Bamba, Jamba and LLaMA-like stacks fit too; they keep their own family
    architecture = "GraniteMoeHybridForCausalLM"
    base_prefix = "model."
    embedding = "model.embed_tokens.weight"
    ignored = (r"rotary_emb\.\w*inv_freq$",)
    gguf = GRANITE_HYBRID  # the multipliers as keys, Mamba-2 layers by their KV head count 0
    defaults = {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": None, "head_dim": None, "hidden_act": "silu",
                "max_position_embeddings": 2048, "initializer_range": 0.02, "rms_norm_eps": 1e-6,
                "tie_word_embeddings": False, "attention_bias": False, "attention_dropout": 0.0,
                "embedding_multiplier": 1.0, "logits_scaling": 1.0, "residual_multiplier": 1.0,
                "attention_multiplier": 1.0, "num_local_experts": 8, "num_experts_per_tok": 2,
                "router_aux_loss_coef": 0.001, "shared_intermediate_size": 1024, "position_embedding_type": None,
                "layer_types": None, "mamba_n_heads": 128, "mamba_n_groups": 1, "mamba_d_state": 256,
                "mamba_d_head": "auto", "mamba_d_conv": 4, "mamba_expand": 2, "mamba_chunk_size": 256,
                "mamba_conv_bias": True, "mamba_proj_bias": False, "time_step_limit": NO_LIMIT}

    def config(self, config: dict) -> dict:
        c = HFConfig(config, self.defaults)
        heads = c.positive_int("num_attention_heads")
        c["num_key_value_heads"] = c["num_key_value_heads"] or heads
        c["head_dim"] = c["head_dim"] or c.positive_int("hidden_size") // heads
        if c["mamba_d_head"] == "auto":
            c["mamba_d_head"] = c["mamba_expand"] * c["hidden_size"] // c["mamba_n_heads"]
        if c["hidden_act"] != "silu":
            raise c.refuse("hidden_act", "granitemoehybrid's Mamba-2 layers and SwiGLU FFNs take their activation "
                                         "from it, and seqzoo's use silu")
        if c["time_step_limit"] is None:  # transformers' PyTorch path cannot run it either
            raise c.refuse("time_step_limit", "write [0.0, Infinity] for no limit")
        for key in ("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling"):
            c.positive_number(key)
        c.positive_int("shared_intermediate_size", why="the shared expert is every layer's FFN")
        experts = c["num_local_experts"]
        if isinstance(experts, bool) or not isinstance(experts, int) or experts < 0:
            raise c.refuse("num_local_experts", "it must be 0 (no experts: the shared expert alone) or more")
        if experts and not (isinstance(c["num_experts_per_tok"], int) and 1 <= c["num_experts_per_tok"] <= experts):
            raise c.refuse("num_experts_per_tok", f"it must be 1..num_local_experts = {experts}")
        return c

    def layer_kinds(self, c: dict) -> list[str]:
        """``mamba`` or ``attention`` for each layer (all Mamba without ``layer_types``)."""
        n = c.positive_int("num_hidden_layers")
        kinds = c["layer_types"] or ["mamba"] * n
        if not isinstance(kinds, list) or len(kinds) != n or any(k not in KINDS for k in kinds):
            raise c.refuse("layer_types", f"it must list num_hidden_layers = {n} entries of "
                                          f"{', '.join(KINDS)}")
        return [KINDS[k] for k in kinds]

    def recipe(self, config: dict, names: Collection[str] = ()) -> dict:
        c = self.config(config)
        kinds = self.layer_kinds(c)
        dim, heads, head_dim, eps = c["hidden_size"], c["num_attention_heads"], c["head_dim"], c["rms_norm_eps"]
        rope = c["position_embedding_type"] == "rope"  # transformers' test: anything else is NoPE
        attention = {"heads": heads, "kv_heads": c["num_key_value_heads"],
                     "score": {"kind": "scaled_dot", "scale": float(c["attention_multiplier"])},
                     "bias": c["attention_bias"], "out_bias": c["attention_bias"], "window": None,
                     "dropout": c["attention_dropout"]}
        if head_dim * heads != dim:
            attention["head_dim"] = head_dim
        shared = glu_ffn("silu", c["shared_intermediate_size"], False)
        ffn = shared if not c["num_local_experts"] else {
            "kind": "moe", "experts": c["num_local_experts"], "top_k": c["num_experts_per_tok"],
            "expert": glu_ffn("silu", HFConfig(c).positive_int("intermediate_size"), False),
            "router": {"kind": "topk_softmax", "bias": False}, "shared": shared,
            "balance_loss": c["router_aux_loss_coef"]}
        model = {"kind": "decoder_lm", "vocab_size": c["vocab_size"], "dim": dim, "layers": len(kinds),
                 "max_seq_len": c["max_position_embeddings"],
                 "position": rope_spec(config, head_dim, c["max_position_embeddings"]) if rope else "none",
                 "norm": {"kind": "rmsnorm", "eps": eps}, "placement": "pre", "attention": attention, "ffn": ffn,
                 "tie_embeddings": c["tie_word_embeddings"], "init_std": c["initializer_range"],
                 "embedding_multiplier": float(c["embedding_multiplier"]),
                 "residual_multiplier": float(c["residual_multiplier"]),
                 "logits_multiplier": 1.0 / c["logits_scaling"]}
        if "mamba" in kinds:
            model["mixer"] = mixer_spec(c, NAMES, dim, eps)
            types = {"mamba": {}, "attention": {"mixer": "attention"}}
            model.update(layer_types={k: types[k] for k in dict.fromkeys(kinds)}, pattern=layer_pattern(kinds))
        return {"model": model}

    def rules(self, config: dict, recipe: dict) -> list[Rule]:
        m = recipe["model"]
        rules = []
        for i, plan in enumerate(layer_plan(m)):
            b, h = f"decoder.blocks.{i}.", f"model.layers.{i}."
            rules += renamed(b, h, {"mixer_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}, False)
            if plan.mixer["kind"] == "mamba2":
                rules += mixer_rules(b + "mixer.", h + "mamba.", plan.mixer)
            else:
                rules += attention_rules(b, h + "self_attn.", plan.attention, m["dim"], out="o_proj",
                                         out_bias=plan.attention.bias)
            ffn, shared = plan.ffn, b + "ffn."
            if ffn["kind"] == "moe":
                shared, moe = b + "ffn.shared.", h + "block_sparse_moe."
                rules += [copy(b + "ffn.router.weight", moe + "router.layer.weight"),
                          copy(b + "ffn.experts.gate_up", moe + "input_linear.weight"),
                          copy(b + "ffn.experts.down", moe + "output_linear.weight")]
                ffn = ffn["shared"]
            rules += [split((shared + "gate.weight", shared + "up.weight"), h + "shared_mlp.input_linear.weight",
                            (ffn["hidden"], ffn["hidden"])),
                      copy(shared + "down.weight", h + "shared_mlp.output_linear.weight")]
        return rules + self.ends(recipe, "model.norm", False)

    @staticmethod
    def mamba_spec(plans: list) -> dict | None:
        return next((p.mixer for p in plans if p.mixer["kind"] == "mamba2"), None)

    def accepts(self, recipe: dict) -> str | None:
        m = recipe["model"]
        if m["kind"] != "decoder_lm":
            return f"model.kind is {m['kind']}, needs decoder_lm"
        plans = layer_plan(m)
        first, spec = plans[0], self.mamba_spec(plans)
        attn, ffn = first.attention, first.ffn
        kinds = {p.mixer["kind"] for p in plans}
        alike = [replace(p, type=None, mixer={}) for p in plans]  # what must not differ between layers
        return first_problem(
            (kinds <= {"mamba2", "attention"}, f"model.mixer: layers use {sorted(kinds)}; Granite's are mamba2 "
                                               f"or attention"),
            (all(p.mixer == spec for p in plans if p.mixer["kind"] == "mamba2"),
             "model.layer_types: the Mamba-2 layers differ; Granite has one set of mamba_* options"),
            (all(p == alike[0] for p in alike),
             "model.layer_types: Granite's layers differ only in their mixer (mamba2 or attention)"),
            (ffn is not None, "model.ffn is None; every Granite layer has an FFN"),
            (kind_of(first.norm) == "rmsnorm", f"model.norm is {kind_of(first.norm)}, needs rmsnorm"),
            (first.placement == "pre" and first.residual == "sequential" and first.mixer_norm,
             "model: Granite is pre-norm, its sublayers in sequence, a norm before every mixer"),
            (kind_of(first.position) in ("rope", "none"), f"model.position is {kind_of(first.position)}, needs "
                                                          f"rope or none"),
            (attn is not None and kind_of(attn.score) == "scaled_dot",
             "model.attention.score must be scaled_dot (Granite scales it by attention_multiplier)"),
            (attn is None or (attn.out_bias in (None, attn.bias) and attn.window is None and attn.qk_norm is None
                              and attn.softcap is None and not attn.sinks and not attn.output_gate),
             "model.attention: Granite's is GQA with one bias setting, no window, QK-norm, softcap, sinks or gate"),
            (m["embed_norm"] is None and not m["scale_embeddings"] and m["final_softcap"] is None,
             "model: Granite has no embedding norm, √C embedding scale or final softcap"),
        ) or self.ffn_problem(ffn) or (kind_of(first.position) == "rope" and rope_problem(
            first.position, m["max_seq_len"], attn.head_dim or m["dim"] // attn.heads)) \
            or (spec is not None and mixer_problem(spec, first.norm["eps"], "Granite")) or None

    @staticmethod
    def ffn_problem(ffn: dict) -> str | None:
        """Why an FFN spec is neither a bias-free SwiGLU nor such experts routed by top-k softmax
        beside a shared one, or None."""
        swiglu = lambda f: ffn_activation(f) == ("silu", True) and not f.get("bias")  # noqa: E731
        if ffn["kind"] != "moe":
            return None if swiglu(ffn) else f"model.ffn is {kind_of(ffn)}; Granite's is SwiGLU without biases"
        router = ffn["router"]
        return first_problem(
            (swiglu(ffn["expert"]), "model.ffn.expert: Granite's experts are SwiGLU without biases"),
            (ffn["shared"] is not None and swiglu(ffn["shared"]) and not ffn["shared_gate"],
             "model.ffn.shared: Granite has an ungated SwiGLU shared expert without biases"),
            (kind_of(router) == "topk_softmax" and not router.get("bias"),
             f"model.ffn.router is {kind_of(router)}; Granite softmaxes its top-k logits, without a bias"),
            (ffn["routed_scale"] == 1.0 and ffn["capacity_factor"] is None,
             "model.ffn: Granite has no routed_scale and drops no token"),
        )

    def hf_config(self, model: nn.Module) -> dict:
        m = model.recipe["model"]
        plans = layer_plan(m)
        first, spec = plans[0], self.mamba_spec(plans)
        attn, ffn = first.attention, first.ffn
        head_dim = attn.head_dim or m["dim"] // attn.heads
        moe = ffn["kind"] == "moe"
        shared = ffn["shared"] if moe else ffn
        rope = kind_of(first.position) == "rope"
        return {"vocab_size": m["vocab_size"], "hidden_size": m["dim"], "num_hidden_layers": m["layers"],
                "layer_types": ["mamba" if p.mixer["kind"] == "mamba2" else "attention" for p in plans],
                "num_attention_heads": attn.heads, "num_key_value_heads": attn.kv_heads or attn.heads,
                "head_dim": head_dim, "hidden_act": "silu", "max_position_embeddings": m["max_seq_len"],
                "rms_norm_eps": first.norm["eps"], "attention_bias": attn.bias, "attention_dropout": attn.dropout,
                "attention_multiplier": attn.score.get("scale") or head_dim ** -0.5,
                "embedding_multiplier": m["embedding_multiplier"], "residual_multiplier": first.residual_multiplier,
                "logits_scaling": scale_of(m["logits_multiplier"]),
                "position_embedding_type": "rope" if rope else "nope",
                **(rope_config(first.position, m["max_seq_len"]) if rope else {}),
                "intermediate_size": ffn["expert"]["hidden"] if moe else shared["hidden"],
                "shared_intermediate_size": shared["hidden"], "num_local_experts": ffn["experts"] if moe else 0,
                "num_experts_per_tok": ffn["top_k"] if moe else 0,
                "router_aux_loss_coef": ffn["balance_loss"] if moe else 0.0,
                # no Mamba layer: sizes that pass GraniteMoeHybridConfig's check (heads·d_head = 2C)
                **(mixer_config(spec, NAMES, m["dim"]) if spec is not None else
                   {"mamba_expand": 2, "mamba_n_heads": 1, "mamba_d_head": 2 * m["dim"]}),
                "tie_word_embeddings": m["tie_embeddings"], "initializer_range": m["init_std"],
                **special_ids(model)}
