"""Mistral (Jiang et al., 2023) <-> ``decoder_lm``: LLaMA plus a sliding window.

HF's ``sliding_window`` W lets query i see keys j with i − j < W (W keys, itself included), which is
exactly ``attention.window``. Mistral has no projection biases.
"""
from __future__ import annotations

from torch import nn

from seqzoo.io.hf import first_problem
from seqzoo.registry import builtin

from .llama import LlamaConverter


@builtin("Hugging Face Mistral <-> decoder_lm (sliding window)")
class MistralConverter(LlamaConverter):
    """LLaMA's keys (no attention_bias / mlp_bias) plus sliding_window (null = full attention)."""

    model_type = "mistral"
    architecture = "MistralForCausalLM"
    defaults = {**LlamaConverter.defaults, "intermediate_size": 14336, "num_key_value_heads": 8,
                "max_position_embeddings": 4096 * 32, "sliding_window": 4096}

    def biases(self, c: dict) -> tuple[bool, bool, bool]:
        return False, False, False

    def window(self, c: dict) -> int | None:
        return c["sliding_window"]

    def attention_problem(self, m: dict) -> str | None:
        attn = m["attention"]
        return first_problem(
            (attn["window"] is not None, "model.attention.window is null (that is LLaMA)"),
            (not attn["bias"] and not attn["out_bias"], "model.attention: Mistral has no biases"),
            (not m["ffn"]["bias"], "model.ffn: Mistral's MLP has no biases"),
        )

    def family_config(self, model: nn.Module) -> dict:
        return {"sliding_window": model.recipe["model"]["attention"]["window"]}
