"""Multi-head latent attention as DeepSeek-layout checkpoints store it (not a family of its own;
DeepSeek-V3's layers, Kimi Linear's full-attention layers): the ``mla`` mixer's tensors and its
config keys.

``q_proj``, or ``q_a_proj`` → ``q_a_layernorm`` → ``q_b_proj`` with a ``q_lora_rank``;
``kv_a_proj_with_mqa`` → [latent | shared key part], ``kv_a_layernorm``, ``kv_b_proj``, ``o_proj``;
``attention_bias`` on the two down projections and the output.
"""
from __future__ import annotations

from collections.abc import Mapping

from seqzoo.io.hf import Rule, linear, renamed


def mixer_rules(ours: str, theirs: str, spec: Mapping) -> list[Rule]:
    """An ``mla`` mixer's tensors (seqzoo prefix ``ours``: the layer's ``mixer.``; HF prefix
    ``theirs``: its ``self_attn.``)."""
    bias = spec["bias"]
    if spec["q_lora_rank"] is None:
        rules = linear(ours + "q_proj", theirs + "q_proj", False)
    else:
        rules = linear(ours + "q_a_proj", theirs + "q_a_proj", bias)
        rules += renamed(ours, theirs, {"q_a_norm": "q_a_layernorm", "q_b_proj": "q_b_proj"}, False)
    rules += linear(ours + "kv_a_proj", theirs + "kv_a_proj_with_mqa", bias)
    rules += renamed(ours, theirs, {"kv_a_norm": "kv_a_layernorm", "kv_b_proj": "kv_b_proj"}, False)
    return rules + linear(ours + "out_proj", theirs + "o_proj", bias)


def mixer_config(spec: Mapping) -> dict:
    """config.json's latent-attention keys for a resolved ``mla`` spec."""
    return {"num_attention_heads": spec["heads"], "num_key_value_heads": spec["heads"],
            "q_lora_rank": spec["q_lora_rank"], "kv_lora_rank": spec["kv_lora_rank"],
            "qk_nope_head_dim": spec["qk_nope_head_dim"], "qk_rope_head_dim": spec["qk_rope_head_dim"],
            "v_head_dim": spec["v_head_dim"] or spec["qk_nope_head_dim"], "attention_bias": spec["bias"]}
