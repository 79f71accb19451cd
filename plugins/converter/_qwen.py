"""What the Qwen families share (not a family of its own): Qwen2's sliding-window rule, which
Qwen3 and both MoE families read, and the sparse layout and routed experts of Qwen2-MoE and
Qwen3-MoE.

Qwen2 can slide a window over the layers from ``max_window_layers`` on (``use_sliding_window``,
or an explicit ``layer_types``); seqzoo has one window for every layer, so a config that mixes
full and sliding layers is refused.
"""
from __future__ import annotations

from collections.abc import Mapping

from torch import nn

from seqzoo.errors import CheckpointError
from seqzoo.io.hf import glu_ffn
from seqzoo.io.hf.config import HFConfig
from seqzoo.io.hf.decoder import LLAMA_DEFAULTS, DecoderConverter

from ._moe import MixtureOfExpertsFamily, softmax_moe, softmax_moe_problem

#: Qwen2Config's defaults (Qwen3's and the MoE families' extend them).
QWEN2_DEFAULTS = {**LLAMA_DEFAULTS, "vocab_size": 151936, "intermediate_size": 22016,
                  "max_position_embeddings": 32768, "use_sliding_window": False, "sliding_window": 4096,
                  "max_window_layers": 28, "layer_types": None}
#: Qwen3Config's defaults.
QWEN3_DEFAULTS = {**QWEN2_DEFAULTS, "head_dim": 128, "attention_bias": False}


class QwenWindow(DecoderConverter):
    """A decoder whose window follows Qwen2's rule (one for all layers, or none)."""

    def window(self, c: Mapping) -> int | None:
        window = c["sliding_window"] if c["use_sliding_window"] else None
        types = c["layer_types"] or [
            "sliding_attention" if window is not None and i >= c["max_window_layers"] else "full_attention"
            for i in range(c["num_hidden_layers"])]
        if len(set(types)) > 1:
            raise CheckpointError(f"config.json: {self.model_type} mixes full and sliding-window layers "
                                  f"({types}); seqzoo uses one window for all layers")
        return c["sliding_window"] if types and types[0] == "sliding_attention" else None

    def attention_problem(self, m: dict) -> str | None:
        window = m["attention"]["window"]  # any window: the config says from which layer on
        return super().attention_problem({**m, "attention": {**m["attention"], "window": None}}) if window \
            else super().attention_problem(m)

    def family_config(self, model: nn.Module) -> dict:
        m = model.recipe["model"]
        window = m["attention"]["window"]
        kind = "full_attention" if window is None else "sliding_attention"
        return {**super().family_config(model), "use_sliding_window": window is not None, "sliding_window": window,
                "max_window_layers": 0 if window is not None else m["layers"], "layer_types": [kind] * m["layers"]}


def experts_of(c: Mapping, names: tuple[str, ...]) -> int:
    """The expert count under whichever of ``names`` the config uses (num_experts is the older
    name of Qwen3-MoE's num_local_experts)."""
    return HFConfig(c).positive_int(next((n for n in names if c.get(n) is not None), names[0]))


class QwenMoeFamily(MixtureOfExpertsFamily):
    """The sparse layout and the experts Qwen2-MoE and Qwen3-MoE share.

    Layer i is sparse iff i is not in ``mlp_only_layers`` and (i + 1) % ``decoder_sparse_step`` = 0;
    the others keep a dense SwiGLU of ``intermediate_size`` (the layer type ``dense``). Experts are
    ``moe_intermediate_size`` wide; ``mlp.gate`` is the router, ``mlp.experts.e.*_proj`` expert e.
    Exports write the sparse layers as ``mlp_only_layers`` with a step of 1."""

    experts_keys: tuple[str, ...] = ("num_local_experts", "num_experts")

    def sparse_layers(self, c: Mapping) -> list[bool]:
        step, only = HFConfig(c).positive_int("decoder_sparse_step"), set(c["mlp_only_layers"] or [])
        return [i not in only and (i + 1) % step == 0 for i in range(c["num_hidden_layers"])]

    def sparse_problem(self, sparse: list[bool]) -> str | None:
        return None  # any set: mlp_only_layers lists the dense ones

    def expert(self, c: Mapping) -> dict:
        return glu_ffn(c["hidden_act"], c["moe_intermediate_size"], False)

    def moe_spec(self, c: Mapping) -> dict:
        return softmax_moe(experts_of(c, self.experts_keys), c["num_experts_per_tok"], self.expert(c),
                           normalize=bool(c["norm_topk_prob"]), balance=c["router_aux_loss_coef"])

    def moe_problem(self, spec: dict) -> str | None:
        return softmax_moe_problem(spec, self.model_type)

    def moe_config(self, spec: dict, sparse: list[bool]) -> dict:
        return {self.experts_keys[0]: spec["experts"], "num_experts_per_tok": spec["top_k"],
                "moe_intermediate_size": spec["expert"]["hidden"], "norm_topk_prob": spec["router"]["normalize"],
                "decoder_sparse_step": 1, "mlp_only_layers": [i for i, s in enumerate(sparse) if not s],
                "router_aux_loss_coef": spec["balance_loss"]}


def every_layer_sparse(normalized: bool):
    """llama.cpp's Qwen MoEs: every layer sparse, top-k weights renormalised or not as it hard-codes."""
    def problem(config) -> str | None:
        if config.get("mlp_only_layers") or config.get("decoder_sparse_step", 1) != 1:
            return "llama.cpp's Qwen MoE architectures make every layer sparse; this model has dense layers"
        if bool(config.get("norm_topk_prob")) != normalized:
            return (f"llama.cpp's architecture {'renormalises' if normalized else 'does not renormalise'} the top-k "
                    f"routing weights; this model's norm_topk_prob is {config.get('norm_topk_prob')}")
        return None
    return problem
