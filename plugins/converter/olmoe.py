"""OLMoE (Muennighoff et al., 2024) <-> ``decoder_lm``: pre-norm RMSNorm layers whose attention
normalises the whole q and k projections (H·D and K·D features, ``qk_norm_scope: projection``,
as OLMo 2 — but with pre-norms), and in every layer a softmax top-k mixture of SwiGLU experts
``intermediate_size`` wide, renormalised only when ``norm_topk_prob`` (false by default).

``clip_qkv`` (clamping q, k and v) has no seqzoo form: a value other than null is refused.
"""
from __future__ import annotations

from seqzoo.errors import CheckpointError
from seqzoo.io.gguf import LLAMA_KEYS, GGUFArch, Key
from seqzoo.io.gguf.arch import first, heads_fill_width
from seqzoo.io.hf import glu_ffn
from seqzoo.io.hf.decoder import LLAMA_DEFAULTS, DecoderConverter, DecoderFamily
from seqzoo.registry import builtin

from ._moe import MixtureOfExpertsFamily, softmax_moe, softmax_moe_problem


def olmoe_problem(config) -> str | None:
    """What llama.cpp's olmoe graph fixes: k-norm over all heads' keys, routing without renormalising."""
    if (config["num_key_value_heads"] or config["num_attention_heads"]) != config["num_attention_heads"]:
        return "llama.cpp's olmoe normalises k over the model's width: it needs as many KV heads as heads"
    if config.get("norm_topk_prob"):
        return "llama.cpp's olmoe does not renormalise the top-k routing weights; this model's norm_topk_prob is true"
    return None


@builtin("Hugging Face OLMoE <-> decoder_lm (whole-projection QK-norm, softmax top-k experts)")
class OlmoeConverter(MixtureOfExpertsFamily, DecoderConverter):
    """LLaMA's keys plus num_experts, num_experts_per_tok, norm_topk_prob, router_aux_loss_coef and
    clip_qkv (null)."""

    family = DecoderFamily(
        "olmoe", "OlmoeForCausalLM", "OLMoE", qk_norm_scope="projection",
        defaults={**LLAMA_DEFAULTS, "vocab_size": 50304, "intermediate_size": 2048, "rms_norm_eps": 1e-5,
                  "max_position_embeddings": 4096, "num_experts": 64, "num_experts_per_tok": 8,
                  "norm_topk_prob": False, "router_aux_loss_coef": 0.01, "clip_qkv": None})
    # llama.cpp's olmoe: softmax top-k without renormalising, a k-norm as wide as the model.
    gguf = GGUFArch("olmoe", keys=LLAMA_KEYS + (Key("expert_count", "num_experts"),
                                                Key("expert_used_count", "num_experts_per_tok")),
                    output="required", problem=first(heads_fill_width, olmoe_problem),
                    config=lambda get: {"norm_topk_prob": False})

    def config(self, config: dict) -> dict:
        c = super().config(config)
        if c["clip_qkv"] is not None:
            raise CheckpointError(f"config.json: clip_qkv {c['clip_qkv']} is not supported; seqzoo does not clamp "
                                  f"q, k and v (set it to null)")
        return c

    def moe_spec(self, c: dict) -> dict:
        return softmax_moe(c["num_experts"], c["num_experts_per_tok"], glu_ffn(c["hidden_act"], c["intermediate_size"],
                                                                             False),
                           normalize=bool(c["norm_topk_prob"]), balance=c["router_aux_loss_coef"])

    def moe_problem(self, spec: dict) -> str | None:
        return softmax_moe_problem(spec, "OLMoE")

    def moe_config(self, spec: dict, sparse: list[bool]) -> dict:
        return {"num_experts": spec["experts"], "num_experts_per_tok": spec["top_k"],
                "norm_topk_prob": spec["router"]["normalize"], "router_aux_loss_coef": spec["balance_loss"],
                "clip_qkv": None}
