"""Qwen3 (Qwen team, 2025) <-> ``decoder_lm``: Qwen2's layout with no q/k/v biases and a QK-norm
— an RMSNorm over each head's D features of q and of k (one weight of D shared by the heads),
after the projection and before RoPE (``attention.qk_norm`` with ``qk_norm_scope: head``).

Its configs give ``head_dim`` explicitly (128 unless set), which need not be ``hidden_size / heads``.
"""
from __future__ import annotations

from torch import nn

from seqzoo.io.hf import first_problem
from seqzoo.registry import builtin

from .qwen2 import Qwen2Converter


@builtin("Hugging Face Qwen3 <-> decoder_lm (per-head QK RMSNorm, no q/k/v biases)")
class Qwen3Converter(Qwen2Converter):
    """Qwen2's keys plus attention_bias (false) and head_dim (128)."""

    model_type = "qwen3"
    architecture = "Qwen3ForCausalLM"
    defaults = {**Qwen2Converter.defaults, "head_dim": 128, "attention_bias": False}
    qk_norm_scope = "head"

    def biases(self, c: dict) -> tuple[bool, bool, bool]:
        return c["attention_bias"], c["attention_bias"], False

    def attention_problem(self, m: dict) -> str | None:
        attn = m["attention"]
        return first_problem(
            (attn["out_bias"] in (None, attn["bias"]), "model.attention: Qwen3 has q/k/v and output biases alike"),
            (not m["ffn"]["bias"], "model.ffn: Qwen3's MLP has no biases"),
        )

    def family_config(self, model: nn.Module) -> dict:
        return {**super().family_config(model), "attention_bias": model.recipe["model"]["attention"]["bias"]}
