"""Mixtral (Jiang et al., 2024) <-> ``decoder_lm``: Mistral's attention and norms, and in every
layer a sparse mixture of SwiGLU experts: a softmax over ``num_local_experts`` router logits, the
``num_experts_per_tok`` largest kept and renormalised (``router: softmax_topk``, normalize: true).

``block_sparse_moe.gate`` is the router's weight; ``block_sparse_moe.experts.e.w1`` / ``w3`` /
``w2`` are expert e's gate / up / down. ``router_aux_loss_coef`` becomes the balancing loss's
coefficient. ``router_jitter_noise`` multiplies the router input by noise while training, which
seqzoo does not do: a non-zero value is refused.
"""
from __future__ import annotations

from seqzoo.errors import CheckpointError
from seqzoo.io.gguf import EXPERT_KEYS, LLAMA_KEYS, GGUFArch
from seqzoo.io.gguf.arch import NORM_ROPE, window_within_context
from seqzoo.io.hf import glu_ffn
from seqzoo.io.hf.decoder import LLAMA_DEFAULTS, DecoderConverter, DecoderFamily
from seqzoo.registry import builtin

from ._moe import MixtureOfExpertsFamily, softmax_moe, softmax_moe_problem


@builtin("Hugging Face Mixtral <-> decoder_lm (Mistral attention, softmax top-k mixture of SwiGLU experts)")
class MixtralConverter(MixtureOfExpertsFamily, DecoderConverter):
    """Mistral's keys (sliding_window null by default) plus num_local_experts, num_experts_per_tok,
    intermediate_size (each expert's width), router_aux_loss_coef and router_jitter_noise (0)."""

    family = DecoderFamily(
        "mixtral", "MixtralForCausalLM", "Mixtral", qkv_bias=False, out_bias=False, window="sliding_window",
        defaults={**LLAMA_DEFAULTS, "intermediate_size": 14336, "num_key_value_heads": 8,
                  "max_position_embeddings": 4096 * 32, "sliding_window": None, "num_local_experts": 8,
                  "num_experts_per_tok": 2, "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0})
    # llama.cpp's llama with experts: softmax over the top k, renormalised, as Mixtral routes.
    gguf = GGUFArch("llama", keys=LLAMA_KEYS + EXPERT_KEYS, transforms=NORM_ROPE,
                    imports=lambda get: bool(get("expert_count")), problem=window_within_context)
    mlp = "block_sparse_moe."
    expert_names = ("w1", "w3", "w2")

    def config(self, config: dict) -> dict:
        c = super().config(config)
        if c["router_jitter_noise"]:
            raise CheckpointError(f"config.json: router_jitter_noise {c['router_jitter_noise']} is not supported; "
                                  f"seqzoo's router adds no training noise (set it to 0.0)")
        return c

    def moe_spec(self, c: dict) -> dict:
        expert = glu_ffn(c["hidden_act"], c["intermediate_size"], False)
        return softmax_moe(c["num_local_experts"], c["num_experts_per_tok"], expert, normalize=True,
                           balance=c["router_aux_loss_coef"])

    def moe_problem(self, spec: dict) -> str | None:
        return softmax_moe_problem(spec, "Mixtral", normalize=True)

    def moe_config(self, spec: dict, sparse: list[bool]) -> dict:
        return {"num_local_experts": spec["experts"], "num_experts_per_tok": spec["top_k"],
                "router_aux_loss_coef": spec["balance_loss"], "router_jitter_noise": 0.0}
