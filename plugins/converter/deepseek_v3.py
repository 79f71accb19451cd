"""DeepSeek-V3 (DeepSeek-AI, 2024) <-> ``decoder_lm``: multi-head latent attention in every layer
(``mixer: mla``), dense SwiGLU in the first ``first_k_dense_replace`` layers and a mixture of
experts in the rest, pre-norm RMSNorm.

- Attention: ``q_a_proj`` → ``q_a_layernorm`` → ``q_b_proj`` (or ``q_proj`` without
  ``q_lora_rank``), ``kv_a_proj_with_mqa`` → [latent | k_pe], ``kv_a_layernorm``, ``kv_b_proj``,
  ``o_proj``; both latent norms use ε = 1e-6 (their class default, not ``rms_norm_eps``). RoPE
  rotates only the ``qk_rope_head_dim`` part, in pairs (2i, 2i+1) with ``rope_interleave`` (which
  transformers writes back de-interleaved in q and k alike: the same dot products). With YaRN
  and ``mscale_all_dim`` the softmax scale is (d_n + d_r)^−½ · m², m = 0.1·mscale_all_dim·ln(factor)
  + 1 (``mixer.scale``); the cos/sin amplitude is the yarn scaling's mscale ratio.
- Experts: ``router: sigmoid_grouped`` — σ(W_r x) in float32, ``e_score_correction_bias`` (the
  router's ``correction_bias``) for the choice only, ``n_group`` groups of which ``topk_group``
  survive, weights renormalised (``norm_topk_prob``) and scaled by ``routed_scaling_factor``
  (``routed_scale``); ``shared_experts`` (``moe_intermediate_size`` · ``n_shared_experts`` wide,
  unweighted) is the ``shared`` FFN.

Not read: ``num_nextn_predict_layers`` (the multi-token-prediction layers, which transformers does
not build either), ``num_key_value_heads`` (MLA has no K/V heads to group).
"""
from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import replace

from torch import nn

from seqzoo.builder import layer_plan
from seqzoo.errors import CheckpointError
from seqzoo.io.gguf import GGUFArch, Key
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
from seqzoo.registry import builtin

from ._moe import expert_rules, sparse_layout

MLA_EPS = 1e-6  # DeepseekV3RMSNorm's default, used by q_a_layernorm and kv_a_layernorm
GLU = {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}


def mla_scale(params: dict, qk_head_dim: int) -> float:
    """transformers' softmax scale: qk_head_dim^−½, times m² under a scaled RoPE with mscale_all_dim."""
    scale = qk_head_dim ** -0.5
    if params.get("rope_type", params.get("type", "default")) != "default" and params.get("mscale_all_dim"):
        factor = params["factor"]
        m = 0.1 * params["mscale_all_dim"] * math.log(factor) + 1.0 if factor > 1 else 1.0
        scale *= m * m
    return scale


#: llama.cpp's deepseek2 metadata from config.json (head sizes and ranks are derived in the hook).
DEEPSEEK_KEYS = (
    Key("block_count", "num_hidden_layers"), Key("context_length", "max_position_embeddings"),
    Key("embedding_length", "hidden_size"), Key("feed_forward_length", "intermediate_size"),
    Key("attention.head_count", "num_attention_heads"), Key("attention.kv_lora_rank", "kv_lora_rank"),
    Key("attention.layer_norm_rms_epsilon", "rms_norm_eps", "f32"),
    Key("leading_dense_block_count", "first_k_dense_replace"),
    Key("expert_feed_forward_length", "moe_intermediate_size"), Key("expert_count", "n_routed_experts"),
    Key("expert_used_count", "num_experts_per_tok"), Key("expert_shared_count", "n_shared_experts"),
    Key("expert_weights_scale", "routed_scaling_factor", "f32"), Key("expert_weights_norm", "norm_topk_prob", "bool"),
    Key("expert_group_count", "n_group"), Key("expert_group_used_count", "topk_group"))


def deepseek_gguf_problem(config) -> str | None:
    if (config.get("rope_parameters") or {}).get("rope_type", "default") != "default":
        return "seqzoo writes DeepSeek's GGUF with plain RoPE only (its YaRN attention scale is not written yet)"
    if not config.get("rope_interleave", True):
        return "llama.cpp's deepseek2 reads interleaved RoPE weights (rope_interleave: true); this model's are not"
    groups = config["n_group"]
    if groups > 1 and not (config["topk_group"] < groups < config["n_routed_experts"]):
        return (f"llama.cpp's deepseek2 needs topk_group < n_group < experts; this model has {config['topk_group']}, "
                f"{groups}, {config['n_routed_experts']}")
    return None


def deepseek_gguf_config(get) -> dict:
    rope = get("rope.dimension_count")
    return {"num_key_value_heads": get("attention.head_count_kv"), "qk_rope_head_dim": rope,
            "qk_nope_head_dim": get("attention.key_length") - rope, "v_head_dim": get("attention.value_length"),
            "head_dim": rope, "q_lora_rank": get("attention.q_lora_rank") or None, "rope_interleave": True}


@builtin("Hugging Face DeepSeek-V3 <-> decoder_lm (latent attention, sigmoid group-limited experts with a "
         "shared one, dense first layers)")
class DeepseekV3Converter(CausalLMConverter):
    """config.json keys: hidden_size, num_hidden_layers, num_attention_heads, q_lora_rank,
    kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, attention_bias, rope_parameters,
    rope_interleave, max_position_embeddings, rms_norm_eps, hidden_act, intermediate_size,
    moe_intermediate_size, n_routed_experts, num_experts_per_tok, n_group, topk_group,
    norm_topk_prob, routed_scaling_factor, n_shared_experts, first_k_dense_replace,
    tie_word_embeddings."""

    model_type = "deepseek_v3"
    architecture = "DeepseekV3ForCausalLM"
    # llama.cpp's deepseek2, in its decompressed form (kv_b as one tensor: latent attention run as
    # multi-head attention), sigmoid routing over expert groups with the score-correction bias.
    gguf = GGUFArch("deepseek2", keys=DEEPSEEK_KEYS,
                    renames={r"gate\.e_score_correction_bias$": "gate.e_score_correction.bias"},
                    fixed={"expert_gating_func": 2}, problem=deepseek_gguf_problem,
                    export=lambda c: {"attention.head_count_kv": c["num_attention_heads"],
                                      "attention.key_length": c["qk_nope_head_dim"] + c["qk_rope_head_dim"],
                                      "attention.value_length": c["v_head_dim"],
                                      "attention.q_lora_rank": c["q_lora_rank"] or 0,
                                      "rope.dimension_count": c["qk_rope_head_dim"]},
                    config=deepseek_gguf_config)
    base_prefix = "model."
    embedding = "model.embed_tokens.weight"
    ignored = (r"rotary_emb\.\w*inv_freq$",)
    defaults = {"vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
                "num_hidden_layers": 61, "num_attention_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256,
                "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
                "v_head_dim": 128, "qk_nope_head_dim": 128, "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8,
                "first_k_dense_replace": 3, "norm_topk_prob": True, "hidden_act": "silu",
                "max_position_embeddings": 4096, "initializer_range": 0.02, "rms_norm_eps": 1e-6,
                "tie_word_embeddings": False, "rope_interleave": True, "attention_bias": False,
                "attention_dropout": 0.0}

    def config(self, config: dict) -> dict:
        c = HFConfig(config, self.defaults)
        if c["attention_dropout"]:
            raise CheckpointError(f"config.json: attention_dropout {c['attention_dropout']} is not supported; "
                                  f"seqzoo's latent attention has no dropout")
        return c

    def recipe(self, config: dict, names: Collection[str] = ()) -> dict:
        c = self.config(config)
        dim, heads, rope = c["hidden_size"], c["num_attention_heads"], c["qk_rope_head_dim"]
        position = {**rope_spec(config, rope, c["max_position_embeddings"]), "interleaved": bool(c["rope_interleave"])}
        mixer = {"kind": "mla", "heads": heads, "q_lora_rank": c["q_lora_rank"], "kv_lora_rank": c["kv_lora_rank"],
                 "qk_nope_head_dim": c["qk_nope_head_dim"], "qk_rope_head_dim": rope, "v_head_dim": c["v_head_dim"],
                 "bias": c["attention_bias"], "norm_eps": MLA_EPS,
                 "scale": mla_scale(config.get("rope_parameters") or config.get("rope_scaling") or {},
                                    c["qk_nope_head_dim"] + rope)}
        act = c["hidden_act"]
        moe = {"kind": "moe", "experts": c["n_routed_experts"], "top_k": c["num_experts_per_tok"],
               "expert": glu_ffn(act, c["moe_intermediate_size"], False),
               "router": {"kind": "sigmoid_grouped", "groups": c["n_group"], "topk_groups": c["topk_group"],
                          "normalize": bool(c["norm_topk_prob"])},
               "routed_scale": float(c["routed_scaling_factor"]), "balance_loss": 0.0}
        if c["n_shared_experts"]:
            moe["shared"] = glu_ffn(act, c["moe_intermediate_size"] * c["n_shared_experts"], False)
        sparse = [i >= c["first_k_dense_replace"] for i in range(c["num_hidden_layers"])]
        return {"model": {
            "kind": "decoder_lm", "vocab_size": c["vocab_size"], "dim": dim, "layers": c["num_hidden_layers"],
            "max_seq_len": c["max_position_embeddings"], "position": position,
            "norm": {"kind": "rmsnorm", "eps": c["rms_norm_eps"]}, "placement": "pre",
            # the attention: section only sizes the position scheme: the d_r rotary part of each head
            "attention": {"heads": heads, "head_dim": rope},
            "mixer": mixer, "ffn": moe, **sparse_layout(sparse, glu_ffn(act, c["intermediate_size"], False)),
            "tie_embeddings": c["tie_word_embeddings"], "init_std": c["initializer_range"],
        }}

    def rules(self, config: dict, recipe: dict) -> list[Rule]:
        rules = []
        for i, plan in enumerate(layer_plan(recipe["model"])):
            b, h = f"decoder.blocks.{i}.", f"model.layers.{i}."
            mla = plan.mixer
            rules += renamed(b, h, {"mixer_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}, False)
            if mla["q_lora_rank"] is None:
                rules += linear(b + "mixer.q_proj", h + "self_attn.q_proj", False)
            else:
                rules += linear(b + "mixer.q_a_proj", h + "self_attn.q_a_proj", mla["bias"])
                rules += renamed(b, h, {"mixer.q_a_norm": "self_attn.q_a_layernorm",
                                        "mixer.q_b_proj": "self_attn.q_b_proj"}, False)
            rules += linear(b + "mixer.kv_a_proj", h + "self_attn.kv_a_proj_with_mqa", mla["bias"])
            rules += renamed(b, h, {"mixer.kv_a_norm": "self_attn.kv_a_layernorm",
                                    "mixer.kv_b_proj": "self_attn.kv_b_proj"}, False)
            rules += linear(b + "mixer.out_proj", h + "self_attn.o_proj", mla["bias"])
            if plan.ffn["kind"] == "moe":
                ours, theirs = b + "ffn.", h + "mlp."
                rules += [Rule(ours + "router.weight", (theirs + "gate.weight",)),
                          Rule(ours + "router.correction_bias", (theirs + "gate.e_score_correction_bias",))]
                rules += expert_rules(ours, theirs, plan.ffn["experts"])
                if plan.ffn["shared"] is not None:
                    rules += renamed(ours + "shared.", theirs + "shared_experts.", GLU, False)
            else:
                rules += renamed(b + "ffn.", h + "mlp.", GLU, False)
        return rules + self.ends(recipe, "model.norm", False)

    def accepts(self, recipe: dict) -> str | None:
        m = recipe["model"]
        if m["kind"] != "decoder_lm":
            return f"model.kind is {m['kind']}, needs decoder_lm"
        plans = layer_plan(m)
        first, mla = plans[0], plans[0].mixer
        sparse = [p.ffn is not None and p.ffn["kind"] == "moe" for p in plans]
        moe = next((p.ffn for p, s in zip(plans, sparse) if s), None)
        dense = [p.ffn for p, s in zip(plans, sparse) if not s]
        alike = [replace(p, type=None, ffn=None) for p in plans]
        position = first.position
        rope = mla.get("qk_rope_head_dim")
        return first_problem(
            (all(p == alike[0] for p in alike), "model.layer_types: DeepSeek-V3's layers differ only in their FFN"),
            (mla["kind"] == "mla", f"model.mixer is {mla['kind']}, needs mla"),
            (moe is not None, "model.ffn: DeepSeek-V3 has mixtures of experts"),
            (sparse == sorted(sparse), "model.layer_types: DeepSeek-V3's dense layers come first"),
            (all(f == dense[0] for f in dense) and all(ffn_activation(f) is not None and ffn_activation(f)[1]
                                                       and not f.get("bias") for f in dense),
             "model.layer_types: the dense layers must share one gated FFN without biases"),
            (all(p.ffn == moe for p, s in zip(plans, sparse) if s), "model.layer_types: the experts differ"),
            (moe is None or self.moe_problem(moe) is None, moe and self.moe_problem(moe)),
            (kind_of(first.norm) == "rmsnorm", f"model.norm is {kind_of(first.norm)}, needs rmsnorm"),
            (first.placement == "pre" and first.residual == "sequential" and first.mixer_norm,
             "model.placement: DeepSeek-V3 is pre-norm with sequential residuals"),
            (mla.get("norm_eps") == MLA_EPS, f"model.mixer.norm_eps must be {MLA_EPS} (DeepSeek-V3's latent norms)"),
            (kind_of(position) == "rope", f"model.position is {kind_of(position)}, needs rope"),
            (m["embed_norm"] is None and not m["scale_embeddings"] and m["final_softcap"] is None,
             "model: DeepSeek-V3 has no embedding norm, embedding scale or final softcap"),
        ) or rope_problem({**position, "interleaved": False}, m["max_seq_len"], rope) or first_problem(
            (math.isclose(mla["scale"] or (mla["qk_nope_head_dim"] + rope) ** -0.5,
                          mla_scale(rope_config(position, m["max_seq_len"])["rope_parameters"],
                                    mla["qk_nope_head_dim"] + rope), rel_tol=1e-6),
             "model.mixer.scale must be DeepSeek-V3's (d_n + d_r)^-1/2, times m² under YaRN with mscale_all_dim"),
        )

    @staticmethod
    def moe_problem(spec: dict) -> str | None:
        router, expert, shared = spec["router"], spec["expert"], spec["shared"]
        return first_problem(
            (kind_of(router) == "sigmoid_grouped", f"model.ffn.router is {kind_of(router)}, needs sigmoid_grouped"),
            (kind_of(expert) == "swiglu" and not expert.get("bias"), "model.ffn.expert must be swiglu without biases"),
            (shared is None or (kind_of(shared) == "swiglu" and not shared.get("bias")
                                and shared["hidden"] % expert["hidden"] == 0),
             "model.ffn.shared must be a swiglu a whole number of experts wide"),
            (not spec["shared_gate"] and spec["capacity_factor"] is None,
             "model.ffn: DeepSeek-V3 has no shared gate and drops no token"),
        )

    def hf_config(self, model: nn.Module) -> dict:
        m = model.recipe["model"]
        plans = layer_plan(m)
        mla = plans[0].mixer
        moe = next(p.ffn for p in plans if p.ffn["kind"] == "moe")
        dense = next((p.ffn for p in plans if p.ffn["kind"] != "moe"), moe["expert"])
        shared = moe["shared"]
        rope = rope_config({**plans[0].position, "interleaved": False}, m["max_seq_len"])
        return {"vocab_size": m["vocab_size"], "hidden_size": m["dim"], "num_hidden_layers": m["layers"],
                "num_attention_heads": mla["heads"], "num_key_value_heads": mla["heads"],
                "q_lora_rank": mla["q_lora_rank"], "kv_lora_rank": mla["kv_lora_rank"],
                "qk_nope_head_dim": mla["qk_nope_head_dim"], "qk_rope_head_dim": mla["qk_rope_head_dim"],
                "v_head_dim": mla["v_head_dim"] or mla["qk_nope_head_dim"], "head_dim": mla["qk_rope_head_dim"],
                "attention_bias": mla["bias"], "rope_interleave": bool(plans[0].position.get("interleaved")),
                **rope, "max_position_embeddings": m["max_seq_len"], "rms_norm_eps": m["norm"]["eps"],
                "hidden_act": ffn_activation(moe["expert"])[0], "intermediate_size": dense["hidden"],
                "moe_intermediate_size": moe["expert"]["hidden"], "n_routed_experts": moe["experts"],
                "num_experts_per_tok": moe["top_k"], "n_group": moe["router"]["groups"],
                "topk_group": moe["router"]["topk_groups"] or moe["router"]["groups"],
                "norm_topk_prob": moe["router"]["normalize"], "routed_scaling_factor": moe["routed_scale"],
                "n_shared_experts": 0 if shared is None else shared["hidden"] // moe["expert"]["hidden"],
                "first_k_dense_replace": sum(p.ffn["kind"] != "moe" for p in plans),
                "tie_word_embeddings": m["tie_embeddings"], "initializer_range": m["init_std"],
                "attention_dropout": 0.0, **special_ids(model)}
