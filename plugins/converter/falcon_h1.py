"""Falcon-H1 (TII, 2025; Zuo et al., "Falcon-H1: A Family of Hybrid-Head Language Models") <->
``decoder_lm``: in every layer attention and Mamba-2 read the same normed input side by side
(``mixer: parallel``, docs/formulas.md §14.10), then a SwiGLU MLP; RMSNorm, pre-norm.

    h ← h + m_ao · Attn(m_ai · n₁(h)) + m_so · Mamba2(m_si · n₁(h)),   h ← h + MLP(n₂(h))

The μP multipliers, and where each goes:
- ``embedding_multiplier``, ``lm_head_multiplier``: the model's ``embedding_multiplier`` and
  ``logits_multiplier`` (§14.12).
- ``attention_in_multiplier`` / ``attention_out_multiplier`` / ``ssm_in_multiplier`` /
  ``ssm_out_multiplier``: the parallel layer's ``in_multipliers`` / ``out_multipliers`` (branches
  [attention, mamba2]).
- ``key_multiplier`` multiplies every key (before RoPE, which is linear): the score's scale,
  ``key_multiplier`` · D^−½.
- Folded into the weights on import, exactly: ``ssm_multipliers``, five factors on the Mamba-2
  in-projection's output slices [z (E) | x (E) | B (G·N) | C (G·N) | Δ (H)] (transformers'
  ``mup_vector``: the rows of ``in_proj`` and its bias), and ``mlp_multipliers`` [gate, down] (the
  rows of ``gate_proj``, and ``down_proj`` with their biases). Exports write these multipliers 1
  and the folded weights: the same function, in the layout transformers loads.

The Mamba-2 mixer is Bamba's ``mamba_*`` options plus ``mamba_d_ssm`` (its inner width, so the
spec names its heads; null: ``mamba_expand`` · hidden_size), ``mamba_rms_norm`` (the gated norm,
off by default: out_proj(y ⊙ SiLU(z))) and ``mamba_norm_before_gate`` (RMSNorm(y) ⊙ SiLU(z));
``mamba_proj_bias`` is in_proj's bias and ``projectors_bias`` out_proj's, which seqzoo's one
``bias`` holds when they agree. Attention is LLaMA's (GQA, ``head_dim``, ``attention_bias`` on
q/k/v/o, whole-head RoPE). ``hidden_act`` drives the conv and the MLP: it must be silu.
"""
from __future__ import annotations

import math
from collections.abc import Collection

import torch
from torch import Tensor, nn

from seqzoo.builder import layer_plan
from seqzoo.io.hf import (
    CausalLMConverter,
    Rule,
    ffn_activation,
    first_problem,
    glu_ffn,
    kind_of,
    renamed,
    special_ids,
)
from seqzoo.io.hf.config import HFConfig
from seqzoo.io.hf.rope import rope_config, rope_problem, rope_spec
from seqzoo.nn.attention import AttentionConfig
from seqzoo.registry import builtin

from ._gated_delta import attention_rules
from ._hybrid_gguf import FALCON_H1
from ._mamba2 import MAMBA_PREFIXED as NAMES
from ._mamba2 import NO_LIMIT, mixer_config, mixer_rules, mixer_spec

#: The μP multipliers of config.json that are scalars, and their FalconH1Config default.
SCALARS = ("embedding_multiplier", "lm_head_multiplier", "key_multiplier", "attention_in_multiplier",
           "attention_out_multiplier", "ssm_in_multiplier", "ssm_out_multiplier")
#: The lists folded into the weights, each with its length.
FOLDED = {"ssm_multipliers": 5, "mlp_multipliers": 2}
GLU = {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}


def scaled(factor: Tensor | float) -> tuple:
    """(load, save) for a tensor whose HF form is ours divided by ``factor`` (a scalar, or one per
    row), computed in float32 and kept in the tensor's dtype."""
    def shape(t: Tensor) -> Tensor | float:
        return factor.to(t.device).view(-1, *[1] * (t.dim() - 1)) if isinstance(factor, Tensor) else factor
    return (lambda t: (t.float() * shape(t)).to(t.dtype), lambda t: ((t.float() / shape(t)).to(t.dtype),))


@builtin("Hugging Face Falcon-H1 <-> decoder_lm (attention and Mamba-2 in parallel in every layer, SwiGLU, "
         "μP multipliers)")
class FalconH1Converter(CausalLMConverter):
    """config.json keys: hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
    num_key_value_heads, head_dim, hidden_act, max_position_embeddings, rms_norm_eps,
    rope_parameters (or rope_theta + rope_scaling), attention_bias, mlp_bias, projectors_bias,
    attention_dropout, tie_word_embeddings, the mamba_* options (mamba_d_ssm, mamba_n_heads,
    mamba_d_head, mamba_n_groups, mamba_d_state, mamba_d_conv, mamba_expand, mamba_chunk_size,
    mamba_conv_bias, mamba_proj_bias, mamba_rms_norm, mamba_norm_before_gate), time_step_limit and
    the μP multipliers; num_logits_to_keep changes nothing seqzoo computes."""

    model_type = "falcon_h1"
    architecture = "FalconH1ForCausalLM"
    base_prefix = "model."
    embedding = "model.embed_tokens.weight"
    ignored = (r"rotary_emb\.\w*inv_freq$", r"mup_vector$")
    gguf = FALCON_H1  # every μP multiplier folded into the weights, as llama.cpp's converter does
    defaults = {"vocab_size": 128000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": None, "hidden_act": "silu",
                "initializer_range": 0.02, "rms_norm_eps": 1e-5, "max_position_embeddings": 8192,
                "attention_dropout": 0.0, "mamba_d_ssm": 1024, "mamba_n_heads": 128, "mamba_d_head": "auto",
                "mamba_n_groups": 1, "mamba_d_state": 256, "mamba_d_conv": 4, "mamba_expand": 2,
                "mamba_chunk_size": 256, "mamba_conv_bias": True, "mamba_proj_bias": False,
                "mamba_norm_before_gate": True, "mamba_rms_norm": False, "time_step_limit": NO_LIMIT,
                "projectors_bias": False, "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
                **dict.fromkeys(SCALARS, 1.0), "mlp_multipliers": None, "ssm_multipliers": None}

    def config(self, config: dict) -> HFConfig:
        c = HFConfig(config, self.defaults)
        c["num_key_value_heads"] = c["num_key_value_heads"] or c["num_attention_heads"]
        c["head_dim"] = c["head_dim"] or c["hidden_size"] // c.positive_int("num_attention_heads")
        c["mamba_d_ssm"] = c["mamba_d_ssm"] or c["mamba_expand"] * c["hidden_size"]
        if c["mamba_d_head"] == "auto":
            c["mamba_d_head"] = c["mamba_d_ssm"] // c.positive_int("mamba_n_heads")
        if c["hidden_act"] != "silu":
            raise c.refuse("hidden_act", "Falcon-H1's Mamba-2 conv and MLP take their activation from it, and "
                                         "seqzoo's use silu; it must be silu")
        if c["mamba_n_heads"] * c["mamba_d_head"] != c["mamba_d_ssm"]:
            raise c.refuse("mamba_d_ssm", f"it must equal mamba_n_heads {c['mamba_n_heads']} × mamba_d_head "
                                          f"{c['mamba_d_head']}")
        if c.flag("mamba_proj_bias") != c.flag("projectors_bias"):
            raise c.refuse("projectors_bias", f"seqzoo's Mamba-2 has one bias setting for in_proj and out_proj; "
                                              f"it must equal mamba_proj_bias {c['mamba_proj_bias']}")
        if c["time_step_limit"] is None:
            raise c.refuse("time_step_limit", "write [0.0, Infinity] for no limit")
        for key in SCALARS:
            c[key] = c.positive_number(key)
        for key, length in FOLDED.items():
            c[key] = [1.0] * length if c[key] is None else c[key]
            if (not isinstance(c[key], list) or len(c[key]) != length
                    or any(isinstance(v, bool) or not isinstance(v, int | float) or not v > 0 for v in c[key])):
                raise c.refuse(key, f"it must list {length} positive numbers")
        return c

    def recipe(self, config: dict, names: Collection[str] = ()) -> dict:
        c = self.config(config)
        dim, heads, head_dim, eps = c["hidden_size"], c["num_attention_heads"], c["head_dim"], c["rms_norm_eps"]
        score = "scaled_dot" if c["key_multiplier"] == 1.0 else \
            {"kind": "scaled_dot", "scale": c["key_multiplier"] * head_dim ** -0.5}
        attention = {"kind": "attention", "heads": heads, "kv_heads": c["num_key_value_heads"], "score": score,
                     "bias": c["attention_bias"], "out_bias": c["attention_bias"], "dropout": c["attention_dropout"],
                     **({"head_dim": head_dim} if head_dim * heads != dim else {})}
        mamba = mixer_spec(c, NAMES, dim, eps, free_heads=True)
        gated = c.flag("mamba_rms_norm")
        mamba.update(rmsnorm=gated, norm_before_gate=gated and c.flag("mamba_norm_before_gate"))
        mixer = {"kind": "parallel", "mixers": [attention, mamba],
                 "in_multipliers": [c["attention_in_multiplier"], c["ssm_in_multiplier"]],
                 "out_multipliers": [c["attention_out_multiplier"], c["ssm_out_multiplier"]]}
        return {"model": {
            "kind": "decoder_lm", "vocab_size": c["vocab_size"], "dim": dim, "layers": c["num_hidden_layers"],
            "max_seq_len": c["max_position_embeddings"],
            "position": rope_spec(config, head_dim, c["max_position_embeddings"]),
            "norm": {"kind": "rmsnorm", "eps": eps}, "placement": "pre",
            # the attention: section only sizes the position scheme; the layers attend through the branch
            "attention": {k: v for k, v in attention.items() if k in ("heads", "kv_heads", "head_dim")},
            "mixer": mixer,
            "ffn": glu_ffn("silu", c["intermediate_size"], c["mlp_bias"]),
            "embedding_multiplier": c["embedding_multiplier"], "logits_multiplier": c["lm_head_multiplier"],
            "tie_embeddings": c["tie_word_embeddings"], "init_std": c["initializer_range"]}}

    def rules(self, config: dict, recipe: dict) -> list[Rule]:
        c = self.config(config)
        m = recipe["model"]
        attention, mamba = layer_plan(m)[0].mixer["mixers"]
        gate, down = c["mlp_multipliers"]
        inner, width = mamba["heads"] * mamba["head_dim"], mamba["groups"] * mamba["state"]
        mup = torch.tensor(c["ssm_multipliers"], dtype=torch.float32).repeat_interleave(
            torch.tensor([inner, inner, width, width, mamba["heads"]]))  # transformers' mup_vector
        bias, ffn_bias = mamba["bias"], m["ffn"]["bias"]
        rules = []
        for i in range(m["layers"]):
            b, h = f"decoder.blocks.{i}.", f"model.layers.{i}."
            rules += renamed(b, h, {"mixer_norm": "input_layernorm", "ffn_norm": "pre_ff_layernorm"}, False)
            rules += attention_rules(b + "mixer.mixers.0.", h + "self_attn.",
                                     AttentionConfig(**{k: v for k, v in attention.items() if k != "kind"}), m["dim"])
            ours, theirs = b + "mixer.mixers.1.", h + "mamba."
            rules += [r for r in mixer_rules(ours, theirs, mamba) if not r.target.startswith(ours + "in_proj.")]
            rules += [Rule(f"{ours}in_proj.{p}", (f"{theirs}in_proj.{p}",), *scaled(mup))
                      for p in (("weight", "bias") if bias else ("weight",))]
            for name, factor in (("gate", gate), ("up", 1.0), ("down", down)):
                rules += [Rule(f"{b}ffn.{name}.{p}", (f"{h}feed_forward.{GLU[name]}.{p}",), *scaled(factor))
                          for p in (("weight", "bias") if ffn_bias else ("weight",))]
        return rules + self.ends(recipe, "model.final_layernorm", False)

    def accepts(self, recipe: dict) -> str | None:
        m = recipe["model"]
        if m["kind"] != "decoder_lm":
            return f"model.kind is {m['kind']}, needs decoder_lm"
        plans = layer_plan(m)
        first = plans[0]
        branches = first.mixer.get("mixers") or []
        kinds = [b["kind"] for b in branches]
        if first.mixer["kind"] != "parallel" or kinds != ["attention", "mamba2"]:
            return (f"model.mixer is {first.mixer['kind']}{f' {kinds}' if kinds else ''}; Falcon-H1's is parallel "
                    f"with the branches [attention, mamba2]")
        attn, mamba = branches
        head_dim = attn["head_dim"] or m["dim"] // attn["heads"]
        eps, limit = first.norm.get("eps"), mamba["dt_limit"]
        return first_problem(
            (all(p == first for p in plans), "model.layer_types: Falcon-H1's layers are all alike"),
            (kind_of(attn["score"]) == "scaled_dot", "model.mixer.mixers[0].score must be scaled_dot"),
            (attn["out_bias"] in (None, attn["bias"]), "model.mixer.mixers[0]: Falcon-H1's q/k/v and output "
                                                       "biases agree"),
            (attn["window"] is None and attn["qk_norm"] is None and attn["softcap"] is None and not attn["sinks"]
             and not attn["output_gate"], "model.mixer.mixers[0]: Falcon-H1's attention has no window, QK-norm, "
                                          "softcap, sinks or output gate"),
            (not mamba["rmsnorm"] or mamba["norm_eps"] == eps,
             f"model.mixer.mixers[1].norm_eps {mamba['norm_eps']} must equal model.norm.eps {eps} (Falcon-H1 has "
             f"one ε)"),
            (limit is None or (len(limit) == 2 and limit[0] <= limit[1]),
             f"model.mixer.mixers[1].dt_limit {limit} must be a pair [lo, hi] with lo ≤ hi"),
            (first.ffn is not None and ffn_activation(first.ffn) == ("silu", True) and kind_of(first.ffn) == "swiglu",
             f"model.ffn is {kind_of(first.ffn)}, needs swiglu (Falcon-H1's MLP)"),
            (kind_of(first.norm) == "rmsnorm", f"model.norm is {kind_of(first.norm)}, needs rmsnorm"),
            (first.placement == "pre" and first.residual == "sequential" and first.mixer_norm
             and first.residual_multiplier == 1.0,
             "model: Falcon-H1 is pre-norm with sequential residuals and no residual multiplier"),
            (kind_of(first.position) == "rope", f"model.position is {kind_of(first.position)}, needs rope"),
            (m["embed_norm"] is None and not m["scale_embeddings"] and m["final_softcap"] is None,
             "model: Falcon-H1 has no embedding norm, √C embedding scale or final softcap"),
        ) or rope_problem(first.position, m["max_seq_len"], head_dim)

    def hf_config(self, model: nn.Module) -> dict:
        m = model.recipe["model"]
        mixer = layer_plan(m)[0].mixer
        attn, mamba = mixer["mixers"]
        heads = attn["heads"]
        head_dim = attn["head_dim"] or m["dim"] // heads
        scale = attn["score"].get("scale")
        (attn_in, ssm_in), (attn_out, ssm_out) = mixer["in_multipliers"], mixer["out_multipliers"]
        ssm = mixer_config(mamba, NAMES, m["dim"])
        return {"vocab_size": m["vocab_size"], "hidden_size": m["dim"],
                "intermediate_size": model.decoder.blocks[0].ffn.hidden, "num_hidden_layers": m["layers"],
                "num_attention_heads": heads, "num_key_value_heads": attn["kv_heads"] or heads, "head_dim": head_dim,
                "hidden_act": "silu", "max_position_embeddings": m["max_seq_len"], "rms_norm_eps": m["norm"]["eps"],
                **rope_config(m["position"], m["max_seq_len"]), "attention_bias": attn["bias"],
                "attention_dropout": attn["dropout"], "mlp_bias": m["ffn"]["bias"], **ssm,
                "mamba_d_ssm": ssm["mamba_n_heads"] * mamba["head_dim"], "mamba_rms_norm": mamba["rmsnorm"],
                "mamba_norm_before_gate": mamba["norm_before_gate"], "projectors_bias": mamba["bias"],
                "embedding_multiplier": m["embedding_multiplier"], "lm_head_multiplier": m["logits_multiplier"],
                "key_multiplier": 1.0 if scale is None else scale * math.sqrt(head_dim),
                "attention_in_multiplier": attn_in, "attention_out_multiplier": attn_out,
                "ssm_in_multiplier": ssm_in, "ssm_out_multiplier": ssm_out,
                **{key: [1.0] * length for key, length in FOLDED.items()},  # folded into the weights
                "tie_word_embeddings": m["tie_embeddings"], "initializer_range": m["init_std"], **special_ids(model)}
