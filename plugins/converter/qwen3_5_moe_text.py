"""Qwen3.5-MoE (Qwen team, 2026), its language model (``qwen3_5_moe_text``) <-> ``decoder_lm``:
Qwen3.5's layers (see ``qwen3_5_text``: Qwen3-Next's with the gated-delta projections split by
kind, the same checkpoint names) with Qwen3-Next's mixture of experts in every layer, its top-k
weights always renormalised: softmax top-``num_experts_per_tok`` over ``num_experts`` SwiGLU
experts ``moe_intermediate_size`` wide, plus a shared SwiGLU expert
``shared_expert_intermediate_size`` wide scaled by σ(``shared_expert_gate``·x).
"""
from __future__ import annotations

from typing import ClassVar

from seqzoo.io.hf import first_problem
from seqzoo.io.hf.config import HFConfig
from seqzoo.registry import builtin

from ._delta_gguf import QWEN35MOE
from ._qwen_next import DEFAULTS, QWEN3_5_DEFAULTS, Qwen3_5Family

#: Qwen3_5MoeTextConfig's defaults (Qwen3.5-35B-A3B's shape, says its docstring).
QWEN3_5_MOE_DEFAULTS = {**{k: v for k, v in QWEN3_5_DEFAULTS.items() if k != "intermediate_size"},
                        **{k: DEFAULTS[k] for k in ("moe_intermediate_size", "shared_expert_intermediate_size",
                                                    "router_aux_loss_coef")},
                        "hidden_size": 2048, "num_hidden_layers": 40, "num_key_value_heads": 2,
                        "num_experts_per_tok": 8, "num_experts": 256}


@builtin("Hugging Face Qwen3.5-MoE text model <-> decoder_lm (Qwen3.5's layers, experts with a gated shared "
         "expert in every layer)")
class Qwen3_5MoeTextConverter(Qwen3_5Family):
    """Qwen3.5's keys plus num_experts, num_experts_per_tok, moe_intermediate_size,
    shared_expert_intermediate_size and router_aux_loss_coef (no dense intermediate_size)."""

    model_type = "qwen3_5_moe_text"
    architecture = "Qwen3_5MoeForCausalLM"
    gguf = QWEN35MOE
    # Its models are Qwen3-Next's with every layer sparse and renormalised: to_hf writes qwen3_next
    # unless this family is named (model_type=, --model-type); the layout of the weights is no
    # part of a recipe.
    named_only = True
    defaults: ClassVar[dict] = QWEN3_5_MOE_DEFAULTS
    name: ClassVar[str] = "Qwen3.5-MoE"

    def sparse_layers(self, c: HFConfig) -> list[bool]:
        return [True] * c["num_hidden_layers"]

    def normalized(self, c: HFConfig) -> bool:
        return True  # its router always renormalises

    def ffn_problem(self, sparse: list[bool], moe: dict | None) -> str | None:
        return first_problem(
            (all(sparse), "model.layer_types: every Qwen3.5-MoE layer is a mixture of experts"),
            (moe is None or moe["router"]["normalize"], "model.ffn.router.normalize must be true for Qwen3.5-MoE"),
        ) or self.moe_problem(moe)

    def ffn_config(self, sparse: list[bool], moe: dict | None, widths: dict) -> dict:
        return self.moe_config(moe, widths)
