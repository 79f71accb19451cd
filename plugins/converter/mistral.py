"""Mistral (Jiang et al., 2023) <-> ``decoder_lm``: LLaMA plus a sliding window.

HF's ``sliding_window`` W lets query i see keys j with i − j < W (W keys, itself included), which is
exactly ``attention.window``. Mistral has no projection biases.
"""
from __future__ import annotations

from seqzoo.io.gguf import GGUFArch
from seqzoo.io.gguf.arch import NORM_ROPE, window_within_context
from seqzoo.io.hf.decoder import LLAMA_DEFAULTS, DecoderConverter, DecoderFamily
from seqzoo.registry import builtin

#: MistralConfig's defaults.
MISTRAL_DEFAULTS = {**LLAMA_DEFAULTS, "intermediate_size": 14336, "num_key_value_heads": 8,
                    "max_position_embeddings": 4096 * 32, "sliding_window": 4096}


@builtin("Hugging Face Mistral <-> decoder_lm (sliding window)")
class MistralConverter(DecoderConverter):
    """LLaMA's keys (no attention_bias / mlp_bias) plus sliding_window (null = full attention)."""

    family = DecoderFamily("mistral", "MistralForCausalLM", "Mistral", defaults=MISTRAL_DEFAULTS,
                           qkv_bias=False, out_bias=False, window="sliding_window", window_required=True)
    # llama.cpp runs Mistral as llama, which has no window: exported only when it spans the context.
    gguf = GGUFArch("llama", transforms=NORM_ROPE, imports=False, problem=window_within_context)
