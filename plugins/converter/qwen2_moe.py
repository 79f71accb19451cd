"""Qwen2-MoE (Qwen team, 2024) <-> ``decoder_lm``: Qwen2's attention (q/k/v biases) and, in the
sparse layers, Qwen3-MoE's routed experts plus a shared expert every token goes through, scaled
by a sigmoid gate: y = Σ_j w_j E_j(x) + σ(g·x) S(x) (``shared`` and ``shared_gate: true``).

``mlp.shared_expert.*_proj`` is S (``shared_expert_intermediate_size`` wide) and
``mlp.shared_expert_gate`` is g; the sparse layout and the routed experts are Qwen3-MoE's.
"""
from __future__ import annotations

from seqzoo.io.gguf import LLAMA_KEYS, GGUFArch, Key, Transform
from seqzoo.io.gguf.arch import first, heads_fill_width, no_window, shared_gate
from seqzoo.io.hf import Rule, first_problem, glu_ffn, kind_of, renamed
from seqzoo.io.hf.config import HFConfig
from seqzoo.io.hf.decoder import DecoderFamily
from seqzoo.registry import builtin

from ._moe import softmax_moe_problem
from ._qwen import QWEN2_DEFAULTS, QwenMoeFamily, QwenWindow, every_layer_sparse

#: Qwen2-MoE's metadata beyond LLaMA's keys.
QWEN2_MOE_KEYS = (Key("expert_count", "num_experts"), Key("expert_used_count", "num_experts_per_tok"),
                  Key("expert_feed_forward_length", "moe_intermediate_size"),
                  Key("expert_shared_feed_forward_length", "shared_expert_intermediate_size"))



@builtin("Hugging Face Qwen2-MoE <-> decoder_lm (routed experts plus a sigmoid-gated shared expert)")
class Qwen2MoeConverter(QwenMoeFamily, QwenWindow):
    """Qwen2's keys plus num_experts, num_experts_per_tok, moe_intermediate_size,
    shared_expert_intermediate_size, norm_topk_prob, decoder_sparse_step, mlp_only_layers,
    router_aux_loss_coef."""

    family = DecoderFamily(
        "qwen2_moe", "Qwen2MoeForCausalLM", "Qwen2-MoE", qkv_bias=True, out_bias=False,
        defaults={**QWEN2_DEFAULTS, "intermediate_size": 5632, "moe_intermediate_size": 1408,
                  "shared_expert_intermediate_size": 5632, "num_experts_per_tok": 4, "num_experts": 60,
                  "norm_topk_prob": False, "decoder_sparse_step": 1, "mlp_only_layers": [],
                  "router_aux_loss_coef": 0.001})
    # llama.cpp's qwen2moe: softmax over the top k without renormalising, a sigmoid-gated shared
    # expert, every layer sparse, and an output head even when tied.
    gguf = GGUFArch("qwen2moe", keys=LLAMA_KEYS + QWEN2_MOE_KEYS, output="required",
                    transforms=(Transform(r"shared_expert_gate\.weight$", shared_gate),),
                    problem=first(no_window, heads_fill_width, every_layer_sparse(normalized=False)),
                    config=lambda get: {"use_sliding_window": False, "norm_topk_prob": False,
                                        "decoder_sparse_step": 1, "mlp_only_layers": []})
    experts_keys = ("num_experts", "num_local_experts")

    def moe_spec(self, c: dict) -> dict:
        width = HFConfig(c).positive_int("shared_expert_intermediate_size",
                                          why="seqzoo's Qwen2-MoE layers have a shared expert at least 1 wide")
        return {**super().moe_spec(c), "shared": glu_ffn(c["hidden_act"], width, False), "shared_gate": True}

    def moe_problem(self, spec: dict) -> str | None:
        shared = spec["shared"]
        return softmax_moe_problem(spec, "Qwen2-MoE", shared=True) or first_problem(
            (kind_of(shared) == kind_of(spec["expert"]) and not shared.get("bias"),
             "model.ffn.shared must be a gated FFN like the experts, without biases"),
            (spec["shared_gate"], "model.ffn.shared_gate is false; Qwen2-MoE gates its shared expert"),
        )

    def layer_moe_rules(self, ours: str, theirs: str, spec: dict) -> list[Rule]:
        return [*super().layer_moe_rules(ours, theirs, spec),
                *renamed(ours + "shared.", theirs + "shared_expert.",
                         {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}, False),
                Rule(ours + "shared_gate.weight", (theirs + "shared_expert_gate.weight",))]

    def moe_config(self, spec: dict, sparse: list[bool]) -> dict:
        return {**super().moe_config(spec, sparse), "shared_expert_intermediate_size": spec["shared"]["hidden"]}
