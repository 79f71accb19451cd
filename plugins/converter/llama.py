"""LLaMA (Touvron et al., 2023) <-> ``decoder_lm``: RoPE (rotate-half), RMSNorm, SwiGLU, GQA.

HF's separate q/k/v projections are stacked into seqzoo's fused [q (H·D) | k (K·D) | v (K·D)];
its RoPE configuration is read and written by ``seqzoo.io.hf.rope``. The layout is the one
``DecoderConverter`` implements; this file is LLaMA's data.
"""
from __future__ import annotations

from seqzoo.io.gguf import GGUFArch
from seqzoo.io.gguf.arch import NORM_ROPE
from seqzoo.io.hf.decoder import LLAMA_DEFAULTS, DecoderConverter, DecoderFamily
from seqzoo.registry import builtin


@builtin("Hugging Face LLaMA <-> decoder_lm (RoPE scalings, GQA, biases)")
class LlamaConverter(DecoderConverter):
    """config.json keys: hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
    num_key_value_heads, head_dim, hidden_act, max_position_embeddings, rms_norm_eps,
    rope_parameters (or rope_theta + rope_scaling), tie_word_embeddings, attention_bias, mlp_bias."""

    family = DecoderFamily("llama", "LlamaForCausalLM", "LLaMA", defaults=LLAMA_DEFAULTS,
                           qkv_bias="attention_bias", out_bias="attention_bias", mlp_bias="mlp_bias",
                           export_keys={"pretraining_tp": 1})
    # llama.cpp's llama rotates adjacent pairs: q and k rows are permuted per head.
    gguf = GGUFArch("llama", transforms=NORM_ROPE, imports=lambda get: not get("expert_count"))
