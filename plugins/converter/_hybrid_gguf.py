"""The GGUF forms of the Mamba-2 hybrids (not a family of their own): Falcon-H1 as llama.cpp's
``falcon-h1``, Granite 4.0-H as ``granitehybrid``, Nemotron-H as ``nemotron_h`` (with experts:
``nemotron_h_moe``), each with the tensors and metadata llama.cpp's own converter writes from the
same config.json (LFM2's, which shares ``kv_heads``, is in ``_lfm2``).

- Mamba-2 layers are stored as llama.cpp's ``mamba2`` stores them (``mamba2``'s own transforms):
  A = −exp(A_log) and D as columns [H, 1], ``dt_bias`` as ``ssm_dt.bias``, the conv [C, 1, K] as
  [C, K], the gated norm [E] as [G, E / G]. llama.cpp's Mamba-2 has no in/out projection biases,
  always adds a conv bias, gates before its norm and never clamps Δ: other models are refused.
- Which layer is which is per-layer metadata: ``attention.head_count_kv`` is 0 on the recurrent
  layers, and Nemotron-H's ``feed_forward_length`` is nonzero on its FFN-only layers.
- Falcon-H1: llama.cpp's graph multiplies by nothing, so its converter folds every μP multiplier
  into the weights, and so does this one (in float64, rounded once): the embedding and the head,
  q / k / v by ``attention_in_multiplier`` (k by ``key_multiplier`` too), o by
  ``attention_out_multiplier``, the Mamba-2 in_proj by ``ssm_in_multiplier``, out_proj by
  ``ssm_out_multiplier`` (``ssm_multipliers`` and ``mlp_multipliers`` are in seqzoo's weights
  already: its import folds them, its export writes them 1). A tied head whose multiplier differs
  from the embedding's is written out as its own. The file reads back as that folded model, all
  multipliers 1: the same function, not the same tensors.
- Granite 4.0-H: the multipliers are keys (``embedding_scale``, ``residual_scale``,
  ``attention.scale``, ``logit_scale``); ``rope.scaling.finetuned`` says whether attention rotates
  (false: NoPE). q and k rows are in llama.cpp's rotary-pair order (its granite RoPE rotates pairs).
- Nemotron-H: relu² MLP layers (``nemotron_h``) or relu² experts behind DeepSeek-V3's sigmoid router
  (``nemotron_h_moe``); llama.cpp's graph has one of the two in a model, not both. q and k rows are
  permuted as llama.cpp's converter permutes them (NoPE: the scores do not change).

``context_length`` is the config's ``max_position_embeddings`` (llama.cpp's converter writes 2^20 for
the NoPE hybrids; the value only bounds llama.cpp's default context).
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping

import torch

from seqzoo.io.gguf import LLAMA_KEYS, GGUFArch, Key, Transform
from seqzoo.io.gguf.arch import NORM_ROPE, gate_up_experts, grouped_norm
from seqzoo.io.hf import Rule

from ._mamba2 import GGUF_CONV, GGUF_PER_HEAD, GGUF_RENAMES


def block(hf: str) -> str:
    return re.search(r"layers\.(\d+)\.", hf).group(1)


# -- Mamba-2 layers, as llama.cpp's mamba2 stores them -----------------------------------------------
def mamba2_transforms(groups_key: str) -> tuple[Transform, ...]:
    """``mamba2``'s transforms (A and D per head, the squeezed conv) and its gated norm grouped by
    the config key ``groups_key``, under ``mamba.`` or ``mixer.``."""
    return GGUF_PER_HEAD, GGUF_CONV, Transform(r"(mamba|mixer)\.norm\.weight$", grouped_norm(groups_key))


def mamba2_problem(config: Mapping, bias: str, conv_bias: str) -> str | None:
    """What llama.cpp's Mamba-2 layer hard-codes (``bias`` / ``conv_bias``: the config's keys)."""
    if config.get(bias):
        return f"llama.cpp's Mamba-2 layers have no in/out projection biases; this model has them ({bias})"
    if not config.get(conv_bias, True):
        return f"llama.cpp's Mamba-2 layers add a conv bias; this model has none ({conv_bias} false)"
    if config.get("time_step_limit") is not None:
        return (f"llama.cpp's Mamba-2 does not clamp Δ; this model has time_step_limit "
                f"{list(config['time_step_limit'])} (export it with model.mixer.dt_limit null)")
    return None


SSM_KEYS = ("ssm.conv_kernel", "ssm.state_size", "ssm.group_count", "ssm.time_step_rank")


def ssm_keys(*names: str) -> tuple[Key, ...]:
    """llama.cpp's Mamba-2 keys from config.json's ``names`` (conv, state, groups, heads)."""
    return tuple(Key(key, name) for key, name in zip(SSM_KEYS, names, strict=True))


def kv_heads(config: Mapping, attends: list[bool]) -> list[int]:
    """KV heads per layer: the model's on attention layers, 0 on the others."""
    return [config.get("num_key_value_heads") or config["num_attention_heads"] if a else 0 for a in attends]


# -- Falcon-H1 ----------------------------------------------------------------------------------------
def folded(factor: Callable[[Mapping], float]) -> Callable[[str, str, Mapping], Rule]:
    """A tensor llama.cpp's graph needs multiplied by ``factor(config)``, folded in float64 and
    rounded once; the import divides by the file's own factor (1)."""
    def rule(hf: str, gguf_name: str, config: Mapping) -> Rule:
        f = factor(config)
        return Rule(hf, (gguf_name,), lambda t: (t.double() / f).to(t.dtype), lambda t: ((t.double() * f).to(t.dtype),))
    return rule


def times(*keys: str) -> Callable[[Mapping], float]:
    return lambda c: math.prod(float(c.get(k, 1.0)) for k in keys)


def falcon_embedding(hf: str, gguf_name: str, config: Mapping) -> Rule:
    """The embedding times embedding_multiplier; a tied head with another multiplier written out."""
    embed, head = float(config.get("embedding_multiplier", 1.0)), float(config.get("lm_head_multiplier", 1.0))
    if not config.get("tie_word_embeddings") or embed == head:
        return folded(lambda c: embed)(hf, gguf_name, config)
    return Rule(hf, (gguf_name, "output.weight"), lambda e, _: (e.double() / embed).to(e.dtype),
                lambda t: ((t.double() * embed).to(t.dtype), (t.double() * head).to(t.dtype)))


def falcon_problem(config: Mapping) -> str | None:
    if config.get("attention_bias"):
        return ("llama.cpp's falcon-h1 graph adds no attention output bias (it passes none to its attention); "
                "this model has attention biases (attention_bias)")
    if config.get("mamba_rms_norm") and config.get("mamba_norm_before_gate"):
        return ("llama.cpp's Mamba-2 gates, then normalises; this model normalises before the gate "
                "(mamba_norm_before_gate)")
    return mamba2_problem(config, "mamba_proj_bias", "mamba_conv_bias") or mamba2_problem(config, "projectors_bias",
                                                                                           "mamba_conv_bias")


FALCON_H1 = GGUFArch(
    "falcon-h1", keys=LLAMA_KEYS + ssm_keys("mamba_d_conv", "mamba_d_state", "mamba_n_groups", "mamba_n_heads")
    + (Key("ssm.inner_size", "mamba_d_ssm"),),
    transforms=(Transform(r"embed_tokens\.weight$", falcon_embedding),
                Transform(r"^lm_head\.weight$", folded(times("lm_head_multiplier"))),
                Transform(r"self_attn\.[qv]_proj\.weight$", folded(times("attention_in_multiplier"))),
                Transform(r"self_attn\.k_proj\.weight$", folded(times("attention_in_multiplier", "key_multiplier"))),
                Transform(r"self_attn\.o_proj\.weight$", folded(times("attention_out_multiplier"))),
                Transform(r"mamba\.in_proj\.weight$", folded(times("ssm_in_multiplier"))),
                Transform(r"mamba\.out_proj\.weight$", folded(times("ssm_out_multiplier"))),
                *mamba2_transforms("mamba_n_groups")),
    renames=GGUF_RENAMES, problem=falcon_problem,
    # every multiplier is in the weights: the import leaves them at their default, 1
    config=lambda get: {"mamba_d_head": get("ssm.inner_size") // get("ssm.time_step_rank"), "hidden_act": "silu",
                        "attention_bias": False, "mamba_proj_bias": False, "projectors_bias": False,
                        "mamba_conv_bias": True, "mamba_norm_before_gate": False},
    from_tensors=lambda names: {"mamba_rms_norm": any(n.endswith("ssm_norm.weight") for n in names),
                                "mlp_bias": any(n.endswith("ffn_up.bias") for n in names)})


# -- Granite 4.0-H ------------------------------------------------------------------------------------
def granite_shared(hf: str, gguf_name: str, config: Mapping) -> Rule:
    """``shared_mlp``'s [gate | up] rows and its down projection: the shared expert's tensors beside
    experts, the layer's own FFN without them."""
    b, shared = block(hf), "_shexp" if config.get("num_local_experts") else ""
    if hf.endswith("output_linear.weight"):
        return Rule(hf, (f"blk.{b}.ffn_down{shared}.weight",))
    return Rule(hf, (f"blk.{b}.ffn_gate{shared}.weight", f"blk.{b}.ffn_up{shared}.weight"),
                lambda gate, up: torch.cat([gate, up]), lambda t: tuple(t.chunk(2)))


def granite_metadata(c: Mapping) -> dict:
    kinds = c.get("layer_types") or ["mamba"] * c["num_hidden_layers"]
    return {"attention.head_count_kv": kv_heads(c, [k in ("attention", "full_attention") for k in kinds]),
            "ssm.inner_size": c["mamba_n_heads"] * c["mamba_d_head"],
            "rope.scaling.finetuned": c.get("position_embedding_type") == "rope",  # llama.cpp's RoPE switch
            "rope.dimension_count": c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]}


def granite_config(get) -> dict:
    """config.json's keys from the file's, with llama.cpp's defaults where it has none: scores scaled
    by D^-1/2, a shared expert as wide as the FFN, RoPE."""
    kv = list(get("attention.head_count_kv"))
    inner, heads = get("ssm.inner_size"), get("ssm.time_step_rank")
    head_dim = get("attention.key_length") or get("embedding_length") // get("attention.head_count")
    return {"layer_types": ["attention" if k else "mamba" for k in kv],
            "num_key_value_heads": max(kv) or get("attention.head_count"),
            "attention_multiplier": get("attention.scale") or head_dim ** -0.5,
            "shared_intermediate_size": get("expert_shared_feed_forward_length") or get("feed_forward_length"),
            "position_embedding_type": "rope" if get("rope.scaling.finetuned", True) else "nope",
            "mamba_d_head": inner // heads, "mamba_expand": inner // get("embedding_length"), "hidden_act": "silu",
            "mamba_proj_bias": False, "mamba_conv_bias": True}


def granite_problem(c: Mapping) -> str | None:
    if c["mamba_n_heads"] * c["mamba_d_head"] != 2 * c["hidden_size"]:
        return (f"llama.cpp's granitehybrid needs Mamba-2 layers twice as wide as the model; this model's are "
                f"{c['mamba_n_heads']} × {c['mamba_d_head']} over {c['hidden_size']}")
    return mamba2_problem(c, "mamba_proj_bias", "mamba_conv_bias")


GRANITE_HYBRID = GGUFArch(
    "granitehybrid", keys=LLAMA_KEYS + ssm_keys("mamba_d_conv", "mamba_d_state", "mamba_n_groups", "mamba_n_heads")
    + (Key("attention.scale", "attention_multiplier", "f32", optional=True),
       Key("embedding_scale", "embedding_multiplier", "f32", 1.0),
       Key("residual_scale", "residual_multiplier", "f32", 1.0), Key("logit_scale", "logits_scaling", "f32", 1.0),
       Key("expert_count", "num_local_experts", default=0), Key("expert_used_count", "num_experts_per_tok", default=0),
       Key("expert_shared_feed_forward_length", "shared_intermediate_size", optional=True)),
    transforms=(*NORM_ROPE, Transform(r"block_sparse_moe\.input_linear\.weight$", gate_up_experts),
                Transform(r"shared_mlp\.(input|output)_linear\.weight$", granite_shared),
                *mamba2_transforms("mamba_n_groups")),
    renames=GGUF_RENAMES, export=granite_metadata, config=granite_config, problem=granite_problem,
    from_tensors=lambda names: {"attention_bias": any(n.endswith("attn_q.bias") for n in names)})


# -- Nemotron-H ---------------------------------------------------------------------------------------
NEMOTRON_KEYS = (
    Key("block_count", "num_hidden_layers"), Key("context_length", "max_position_embeddings"),
    Key("embedding_length", "hidden_size"), Key("attention.head_count", "num_attention_heads", optional=True),
    Key("attention.key_length", "head_dim", optional=True), Key("attention.value_length", "head_dim", optional=True),
    Key("attention.layer_norm_epsilon", "layer_norm_epsilon", "f32"),
    *ssm_keys("conv_kernel", "ssm_state_size", "n_groups", "mamba_num_heads"))
NEMOTRON_MOE_KEYS = NEMOTRON_KEYS + (
    Key("expert_count", "n_routed_experts"), Key("expert_used_count", "num_experts_per_tok"),
    Key("expert_feed_forward_length", "moe_intermediate_size"),
    Key("expert_shared_feed_forward_length", "moe_shared_expert_intermediate_size"),
    Key("expert_shared_count", "n_shared_experts", default=1), Key("expert_weights_norm", "norm_topk_prob", "bool"),
    Key("expert_weights_scale", "routed_scaling_factor", "f32"))
FFN_KINDS = ("mlp", "moe")


def nemotron_kinds(c: Mapping) -> list[str]:
    """Each layer's kind as the exporter writes them: linear_attention, full_attention, mlp, moe."""
    return list(c["layers_block_type"])


def nemotron_metadata(c: Mapping) -> dict:
    kinds = nemotron_kinds(c)
    width = c.get("moe_intermediate_size") if "moe" in kinds else c.get("intermediate_size")
    out = {"attention.head_count_kv": kv_heads(c, [k == "full_attention" for k in kinds]),
           "feed_forward_length": [width if k in FFN_KINDS else 0 for k in kinds],
           "ssm.inner_size": c["mamba_num_heads"] * c["mamba_head_dim"]}
    if c.get("head_dim"):  # as llama.cpp's converter writes them (NoPE: unread)
        out.update({"rope.dimension_count": c["head_dim"], "rope.scaling.finetuned": False})
    if c.get("n_routed_experts"):
        groups, used = c.get("n_group", 1), c.get("topk_group", 1)
        # every group kept is no grouping at all, which llama.cpp only accepts as one group
        out.update(expert_group_count=groups if used < groups else 1,
                   expert_group_used_count=used if used < groups else 1)
    return out


def nemotron_config(moe: bool) -> Callable:
    def config(get) -> dict:
        kv, ff = list(get("attention.head_count_kv")), list(get("feed_forward_length"))
        kinds = ["full_attention" if k else (("moe" if moe else "mlp") if f else "linear_attention")
                 for k, f in zip(kv, ff, strict=True)]
        out = {"layers_block_type": kinds, "num_key_value_heads": max(kv) or None,
               "mamba_head_dim": get("ssm.inner_size") // get("ssm.time_step_rank"), "use_bias": False,
               "use_conv_bias": True, "mamba_hidden_act": "silu", "mlp_hidden_act": "relu2"}
        if moe:
            groups = get("expert_group_count", 1)
            out.update(n_group=groups, topk_group=get("expert_group_used_count", groups))
        elif any(ff):
            out["intermediate_size"] = max(ff)
        return out
    return config


def nemotron_problem(c: Mapping) -> str | None:
    kinds = nemotron_kinds(c)
    if "linear_attention" not in kinds:
        return "llama.cpp's nemotron_h needs the Mamba-2 sizes (its ssm.* keys); this model has no Mamba-2 layer"
    if c.get("mlp_hidden_act", "relu2") != "relu2":
        return (f"llama.cpp's nemotron_h computes relu² MLPs and experts; this model's activation is "
                f"{c['mlp_hidden_act']} (mlp_hidden_act)")
    if "moe" in kinds and "mlp" in kinds:
        return ("llama.cpp's nemotron_h_moe makes every FFN layer a mixture of experts; this model has dense MLP "
                "layers beside its expert layers")
    if "moe" in kinds and c.get("mlp_bias"):
        return "llama.cpp's nemotron_h_moe shared expert has no biases; this model has them (mlp_bias)"
    return mamba2_problem(c, "use_bias", "use_conv_bias")


def nemotron_arch(name: str, keys: tuple[Key, ...], moe: bool, **more) -> GGUFArch:
    return GGUFArch(
        name, keys=keys, **more, rope=False, export=nemotron_metadata, config=nemotron_config(moe),
        problem=nemotron_problem,
        transforms=(*NORM_ROPE, *mamba2_transforms("n_groups")),
        renames={**GGUF_RENAMES, r"gate\.e_score_correction_bias$": "gate.e_score_correction.bias",
                 r"^backbone\.layers\.(\d+)\.mixer\.experts\.": r"model.layers.\1.mlp.experts."},
        from_tensors=lambda names: {"mlp_bias": any(n.endswith("ffn_up.bias") for n in names)})


NEMOTRON_H = nemotron_arch("nemotron_h", NEMOTRON_KEYS, False,
                           variants=(nemotron_arch("nemotron_h_moe", NEMOTRON_MOE_KEYS, True),),
                           variant=lambda c: "nemotron_h_moe" if "moe" in nemotron_kinds(c) else "nemotron_h")
