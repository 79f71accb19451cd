"""Qwen3-MoE (Qwen team, 2025) <-> ``decoder_lm``: Qwen3's attention (per-head QK RMSNorm, no
biases) and a mixture of SwiGLU experts in the sparse layers: softmax over ``num_experts``, the
``num_experts_per_tok`` largest kept, renormalised only when ``norm_topk_prob`` (false by default).

Layer i is sparse iff i is not in ``mlp_only_layers`` and (i + 1) % ``decoder_sparse_step`` = 0;
the others keep a dense SwiGLU of ``intermediate_size`` (the layer type ``dense``). Experts are
``moe_intermediate_size`` wide; ``mlp.gate`` is the router, ``mlp.experts.e.*_proj`` expert e.
Exports write the sparse layers as ``mlp_only_layers`` with a step of 1.
"""
from __future__ import annotations

from seqzoo.errors import CheckpointError
from seqzoo.io.hf import glu_ffn
from seqzoo.registry import builtin

from ._moe import MixtureOfExpertsFamily, softmax_moe, softmax_moe_problem
from .qwen3 import Qwen3Converter


def experts_of(c: dict, names: tuple[str, ...]) -> int:
    """The expert count under whichever of ``names`` the config uses (num_experts is the older
    name of Qwen3-MoE's num_local_experts)."""
    value = next((c[n] for n in names if c.get(n) is not None), None)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CheckpointError(f"config.json: {names[0]} {value!r} is not supported; it must be a positive integer")
    return value


class QwenMoeFamily(MixtureOfExpertsFamily):
    """The sparse layout and the experts Qwen2-MoE and Qwen3-MoE share."""

    experts_keys: tuple[str, ...] = ("num_local_experts", "num_experts")

    def sparse_layers(self, c: dict) -> list[bool]:
        step, only = c["decoder_sparse_step"], set(c["mlp_only_layers"] or [])
        if isinstance(step, bool) or not isinstance(step, int) or step < 1:
            raise CheckpointError(f"config.json: decoder_sparse_step {step!r} is not supported; it must be a "
                                  f"positive integer")
        return [i not in only and (i + 1) % step == 0 for i in range(c["num_hidden_layers"])]

    def sparse_problem(self, sparse: list[bool]) -> str | None:
        return None  # any set: mlp_only_layers lists the dense ones

    def expert(self, c: dict) -> dict:
        return glu_ffn(c["hidden_act"], c["moe_intermediate_size"], False)

    def moe_spec(self, c: dict) -> dict:
        return softmax_moe(experts_of(c, self.experts_keys), c["num_experts_per_tok"], self.expert(c),
                           normalize=bool(c["norm_topk_prob"]), balance=c["router_aux_loss_coef"])

    def moe_problem(self, spec: dict) -> str | None:
        return softmax_moe_problem(spec, self.model_type)

    def moe_config(self, spec: dict, sparse: list[bool]) -> dict:
        return {self.experts_keys[0]: spec["experts"], "num_experts_per_tok": spec["top_k"],
                "moe_intermediate_size": spec["expert"]["hidden"], "norm_topk_prob": spec["router"]["normalize"],
                "decoder_sparse_step": 1, "mlp_only_layers": [i for i, s in enumerate(sparse) if not s],
                "router_aux_loss_coef": spec["balance_loss"]}


@builtin("Hugging Face Qwen3-MoE <-> decoder_lm (Qwen3 attention, softmax top-k experts, dense mlp_only_layers)")
class Qwen3MoeConverter(QwenMoeFamily, Qwen3Converter):
    """Qwen3's keys plus num_local_experts (or num_experts), num_experts_per_tok,
    moe_intermediate_size, norm_topk_prob, decoder_sparse_step, mlp_only_layers, router_aux_loss_coef."""

    model_type = "qwen3_moe"
    architecture = "Qwen3MoeForCausalLM"
    defaults = {**Qwen3Converter.defaults, "intermediate_size": 6144, "moe_intermediate_size": 768,
                "num_experts_per_tok": 8, "num_local_experts": 128, "norm_topk_prob": False,
                "decoder_sparse_step": 1, "mlp_only_layers": [], "router_aux_loss_coef": 0.001}
