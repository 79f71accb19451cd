"""Qwen3-MoE (Qwen team, 2025) <-> ``decoder_lm``: Qwen3's attention (per-head QK RMSNorm, no
biases) and a mixture of SwiGLU experts in the sparse layers: softmax over ``num_experts``, the
``num_experts_per_tok`` largest kept, renormalised only when ``norm_topk_prob`` (false by default).

Layer i is sparse iff i is not in ``mlp_only_layers`` and (i + 1) % ``decoder_sparse_step`` = 0;
the others keep a dense SwiGLU of ``intermediate_size`` (the layer type ``dense``). Experts are
``moe_intermediate_size`` wide; ``mlp.gate`` is the router, ``mlp.experts.e.*_proj`` expert e.
Exports write the sparse layers as ``mlp_only_layers`` with a step of 1.
"""
from __future__ import annotations

from seqzoo.io.gguf import EXPERT_KEYS, LLAMA_KEYS, GGUFArch, Key
from seqzoo.io.gguf.arch import first, no_window
from seqzoo.io.hf.decoder import DecoderFamily
from seqzoo.registry import builtin

from ._qwen import QWEN3_DEFAULTS, QwenMoeFamily, QwenWindow, every_layer_sparse


@builtin("Hugging Face Qwen3-MoE <-> decoder_lm (Qwen3 attention, softmax top-k experts, dense mlp_only_layers)")
class Qwen3MoeConverter(QwenMoeFamily, QwenWindow):
    """Qwen3's keys plus num_local_experts (or num_experts), num_experts_per_tok,
    moe_intermediate_size, norm_topk_prob, decoder_sparse_step, mlp_only_layers, router_aux_loss_coef."""

    family = DecoderFamily(
        "qwen3_moe", "Qwen3MoeForCausalLM", "Qwen3-MoE", qk_norm_scope="head",
        defaults={**QWEN3_DEFAULTS, "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts_per_tok": 8,
                  "num_local_experts": 128, "norm_topk_prob": False, "decoder_sparse_step": 1, "mlp_only_layers": [],
                  "router_aux_loss_coef": 0.001})
    # llama.cpp's qwen3moe renormalises the top-k weights and makes every layer sparse.
    gguf = GGUFArch("qwen3moe",
                    keys=LLAMA_KEYS + EXPERT_KEYS + (Key("expert_feed_forward_length", "moe_intermediate_size"),),
                    problem=first(no_window, every_layer_sparse(normalized=True)),
                    config=lambda get: {"use_sliding_window": False, "norm_topk_prob": True,
                                        "decoder_sparse_step": 1, "mlp_only_layers": []})
