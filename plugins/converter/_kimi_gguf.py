"""Kimi Linear's GGUF form, llama.cpp's ``kimi-linear`` (not a family of its own): the tensors and
metadata llama.cpp's own converter writes from the same config.json.

- ``kv_b_proj`` is stored split, ``attn_k_b`` (each head's key rows transposed) and ``attn_v_b``:
  llama.cpp's graph runs latent attention in that absorbed form (its fallback for one ``attn_kv_b``
  puts the keys' shared part first where the queries' comes last, so no file of that form is written);
- the KDA convs [C, 1, K] as [1, C, 1, K] (kept float32: ggml's conv reads no other type), A =
  −exp(A_log) in A_log's [1, 1, H, 1], dt_bias as ``ssm_dt.bias``;
- which layers attend: ``attention.head_count_kv`` per layer, 1 on latent-attention layers (one
  shared latent, as llama.cpp caches it), 0 on KDA layers; ``kda.head_dim``, the MLA widths
  (``key_length`` = kv_lora_rank + d_r, ``key_length_mla`` = d_n + d_r, ``value_length_mla``),
  ``leading_dense_block_count``, sigmoid gating (``expert_gating_func`` 2) with groups where > 1.

What llama.cpp hard-codes and a model may not match is refused (``kimi_problem``). One difference
is documented instead: llama.cpp L2-normalises the KDA layers' q and k, and RMS-normalises the
latent, with ε = ``rms_norm_eps`` where transformers uses 1e-6 for both (Kimi Linear's own ε is 1e-5).
"""
from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from seqzoo.io.gguf import GGUFArch, Key, Transform
from seqzoo.io.hf import Rule

from ._delta_gguf import a_from_log, block, eps_note
from ._gated_delta import FULL, LINEAR

#: llama.cpp's kimi-linear metadata from config.json (per-layer KV heads and MLA widths are derived).
KIMI_KEYS = (
    Key("block_count", "num_hidden_layers"), Key("context_length", "model_max_length"),
    Key("embedding_length", "hidden_size"), Key("feed_forward_length", "intermediate_size"),
    Key("attention.head_count", "num_attention_heads"), Key("attention.layer_norm_rms_epsilon", "rms_norm_eps", "f32"),
    Key("attention.kv_lora_rank", "kv_lora_rank"), Key("rope.dimension_count", "qk_rope_head_dim"),
    Key("attention.value_length_mla", "v_head_dim"), Key("ssm.conv_kernel", "linear_conv_kernel_dim"),
    Key("kda.head_dim", "linear_head_dim"), Key("expert_count", "num_experts"),
    Key("expert_used_count", "num_experts_per_token"), Key("expert_feed_forward_length", "moe_intermediate_size"),
    Key("expert_shared_count", "num_shared_experts"), Key("leading_dense_block_count", "first_k_dense_replace"),
    Key("expert_weights_scale", "routed_scaling_factor", "f32"), Key("rope.freq_base", "rope_theta", "f32",
                                                                      optional=True))


def latent_kv(hf: str, gguf_name: str, config: Mapping) -> Rule:
    """``kv_b_proj`` [H·(d_n + d_v), r] as llama.cpp's absorbed form: ``attn_k_b`` [H, r, d_n] (each
    head's key rows transposed) and ``attn_v_b`` [H, d_v, r]."""
    heads, nope, value = config["num_attention_heads"], config["qk_nope_head_dim"], config["v_head_dim"]
    b = block(hf)

    def save(w: Tensor) -> tuple[Tensor, Tensor]:
        k, v = w.reshape(heads, nope + value, -1).split([nope, value], 1)
        return k.transpose(1, 2).contiguous(), v.contiguous()
    return Rule(hf, (f"blk.{b}.attn_k_b.weight", f"blk.{b}.attn_v_b.weight"),
                lambda k, v: torch.cat([k.transpose(1, 2), v], 1).reshape(heads * (nope + value), -1), save)


def kda_conv(hf: str, gguf_name: str, config: Mapping) -> Rule:
    """A KDA conv [C, 1, K] as llama.cpp's converter writes it, [1, C, 1, K]."""
    return Rule(hf, (gguf_name,), lambda t: t.reshape(t.shape[1], 1, t.shape[-1]),
                lambda t: (t.reshape(1, t.shape[0], 1, t.shape[-1]),))


def kimi_metadata(config: Mapping) -> dict:
    return {"attention.head_count_kv": [int(kind == FULL) for kind in config["layer_types"]],
            "attention.key_length": config["kv_lora_rank"] + config["qk_rope_head_dim"],
            "attention.key_length_mla": config["qk_nope_head_dim"] + config["qk_rope_head_dim"],
            **({"expert_group_count": config["num_expert_group"], "expert_group_used_count": config["topk_group"]}
               if config["num_expert_group"] > 1 else {})}


def kimi_config(get) -> dict:
    dense, n = get("leading_dense_block_count", 0), get("block_count")
    groups = get("expert_group_count", 1)
    return {"layer_types": [FULL if kv else LINEAR for kv in get("attention.head_count_kv")],
            "mlp_layer_types": ["dense" if i < dense else "sparse" for i in range(n)],
            "linear_num_heads": get("attention.head_count"), "q_lora_rank": None, "attention_bias": False,
            "qk_nope_head_dim": get("attention.key_length_mla") - get("rope.dimension_count"),
            "num_expert_group": groups, "topk_group": get("expert_group_used_count", groups),
            "moe_renormalize": True, "hidden_act": "silu"}


def kimi_problem(config: Mapping) -> str | None:
    """What llama.cpp's kimi-linear graph hard-codes."""
    kinds, experts = config["mlp_layer_types"], config.get("num_experts")
    dense = kinds.count("dense")
    groups, used = config.get("num_expert_group", 1), config.get("topk_group", 1)
    if config.get("q_lora_rank"):
        return (f"llama.cpp's kimi-linear projects queries with q_proj alone; this model has a query LoRA "
                f"(q_lora_rank {config['q_lora_rank']})")
    if config.get("attention_bias"):
        return "llama.cpp's kimi-linear latent attention has no biases; this model has them (attention_bias)"
    if config["linear_num_heads"] != config["num_attention_heads"]:
        return (f"llama.cpp's kimi-linear gives its KDA layers the attention's head count; this model has "
                f"{config['linear_num_heads']} KDA heads and {config['num_attention_heads']} attention heads")
    if "sparse" not in kinds or kinds != ["dense"] * dense + ["sparse"] * (len(kinds) - dense):
        return ("llama.cpp's kimi-linear has dense FFNs in the first layers and experts in all the rest "
                f"(leading_dense_block_count); this model's are {kinds}")
    if not config.get("moe_renormalize", True):
        return "llama.cpp's kimi-linear renormalises the top-k routing weights; this model does not (moe_renormalize)"
    if groups > 1 and not used < groups < experts:
        return f"llama.cpp needs topk_group < groups < experts; this model has {used}, {groups}, {experts}"
    return eps_note("the L2 norm of the KDA layers' q and k and the latent attention's latent norm")(config)


KIMI_LINEAR = GGUFArch("kimi-linear", keys=KIMI_KEYS, rope=False, output="required", fixed={"expert_gating_func": 2},
                       transforms=(Transform(r"kv_b_proj\.weight$", latent_kv),
                                   Transform(r"_conv1d\.weight$", kda_conv), Transform(r"\.A_log$", a_from_log)),
                       renames={r"\.dt_bias$": ".dt_proj.bias",
                                r"gate\.e_score_correction_bias$": "gate.e_score_correction.bias"},
                       export=kimi_metadata, config=kimi_config, problem=kimi_problem)
