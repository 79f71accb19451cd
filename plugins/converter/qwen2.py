"""Qwen2 (Qwen team, 2024) <-> ``decoder_lm``: LLaMA with biases on q/k/v but not on the output
projection (``attention.out_bias: false``).

Qwen2 can slide a window over the layers from ``max_window_layers`` on (``use_sliding_window``,
or an explicit ``layer_types``); seqzoo has one window for every layer, so a config that mixes
full and sliding layers is refused.
"""
from __future__ import annotations

from torch import nn

from seqzoo.errors import CheckpointError
from seqzoo.io.hf import first_problem
from seqzoo.registry import builtin

from .llama import LlamaConverter


@builtin("Hugging Face Qwen2 <-> decoder_lm (q/k/v biases, no output bias)")
class Qwen2Converter(LlamaConverter):
    """LLaMA's keys (no attention_bias / mlp_bias) plus use_sliding_window, sliding_window,
    max_window_layers, layer_types."""

    model_type = "qwen2"
    architecture = "Qwen2ForCausalLM"
    defaults = {**LlamaConverter.defaults, "vocab_size": 151936, "intermediate_size": 22016,
                "max_position_embeddings": 32768, "use_sliding_window": False,
                "sliding_window": 4096, "max_window_layers": 28, "layer_types": None}

    def biases(self, c: dict) -> tuple[bool, bool, bool]:
        return True, False, False

    def window(self, c: dict) -> int | None:
        window = c["sliding_window"] if c["use_sliding_window"] else None
        types = c["layer_types"] or [
            "sliding_attention" if window is not None and i >= c["max_window_layers"] else "full_attention"
            for i in range(c["num_hidden_layers"])]
        if len(set(types)) > 1:
            raise CheckpointError("config.json: qwen2 mixes full and sliding-window layers "
                                  f"({types}); seqzoo uses one window for all layers")
        return c["sliding_window"] if types and types[0] == "sliding_attention" else None

    def attention_problem(self, m: dict) -> str | None:
        attn = m["attention"]
        return first_problem(
            (attn["bias"] and attn["out_bias"] is False,
             "model.attention: Qwen2 has q/k/v biases and no output bias (bias: true, out_bias: false)"),
            (not m["ffn"]["bias"], "model.ffn: Qwen2's MLP has no biases"),
        )

    def family_config(self, model: nn.Module) -> dict:
        m = model.recipe["model"]
        window = m["attention"]["window"]
        kind = "full_attention" if window is None else "sliding_attention"
        return {"use_sliding_window": window is not None, "sliding_window": window,
                "max_window_layers": 0 if window is not None else m["layers"],
                "layer_types": [kind] * m["layers"]}
