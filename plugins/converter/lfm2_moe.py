"""LFM2-MoE (Liquid AI, 2025; LFM2-8B-A1B) <-> ``decoder_lm``: LFM2's short-conv and attention
layers (see ``lfm2``), a dense SwiGLU in the first ``num_dense_layers`` layers and a mixture of
experts in the rest.

- Layers: ``layer_types`` (``conv`` / ``full_attention``), which Lfm2MoeConfig needs: it has no
  ``full_attn_idxs``. The dense layers are ``layer_overrides`` of their FFN.
- Dense FFN: ``feed_forward.w1`` / ``w3`` / ``w2``, ``intermediate_size`` wide as it stands (no
  block_* adjustment here).
- Experts: ``num_experts`` SwiGLUs of ``moe_intermediate_size``, stored per expert as
  ``feed_forward.experts.e.w1`` / ``w3`` / ``w2`` (transformers 5 fuses them on load and splits them
  again on save; seqzoo stacks them). The router (``feed_forward.gate``) scores σ(W x); with
  ``use_expert_bias`` the buffer ``feed_forward.expert_bias`` is added for the choice of the top
  ``num_experts_per_tok`` only; the chosen scores are renormalised if ``norm_topk_prob`` and
  scaled by ``routed_scaling_factor``. That is DeepSeek-V3's router with one group
  (``router: sigmoid_grouped``, its ``correction_bias``; a zero one without ``use_expert_bias``,
  the same choice) and ``routed_scale``. Exports always write ``use_expert_bias: true``.

transformers renormalises the chosen weights by Σ + 1e-6, seqzoo's router by Σ + 1e-20 (DeepSeek-V3's):
a relative difference of about 1e-6 / Σ, Σ the k chosen sigmoids — below float32's noise on the
logits (≤ 2e-7 measured in tests/test_hf_lfm2.py), so the router has no option for it.
"""
from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from seqzoo.builder import LayerPlan
from seqzoo.io.hf import Rule, copy, first_problem, glu_ffn, kind_of
from seqzoo.io.hf.config import HFConfig
from seqzoo.registry import builtin

from ._lfm2 import DEFAULTS, KINDS, LFM2MOE, SWIGLU, Lfm2Family, swiglu
from ._moe import expert_rules

#: Lfm2MoeConfig's defaults.
MOE_DEFAULTS: dict[str, Any] = {
    **{k: v for k, v in DEFAULTS.items() if not k.startswith("block_") and k != "full_attn_idxs"},
    "hidden_size": 2048, "intermediate_size": 7168, "moe_intermediate_size": 1792, "num_dense_layers": 2,
    "num_experts": 32, "num_experts_per_tok": 4, "use_expert_bias": True, "routed_scaling_factor": 1.0,
    "norm_topk_prob": True}


@builtin("Hugging Face LFM2-MoE <-> decoder_lm (LFM2's conv/attention layers, sigmoid-routed experts after "
         "dense layers)")
class Lfm2MoeConverter(Lfm2Family):
    """config.json keys: LFM2's (without the block_* FFN keys and full_attn_idxs) plus
    moe_intermediate_size, num_dense_layers, num_experts, num_experts_per_tok, use_expert_bias,
    routed_scaling_factor, norm_topk_prob; output_router_logits changes nothing seqzoo computes."""

    model_type = "lfm2_moe"
    architecture = "Lfm2MoeForCausalLM"
    named_only = False  # its experts fit no other family
    gguf = LFM2MOE
    defaults: ClassVar[dict[str, Any]] = MOE_DEFAULTS
    legacy: ClassVar[dict[str, str]] = {"tie_embedding": "tie_word_embeddings"}

    def config(self, config: dict) -> HFConfig:
        c = super().config(config)
        experts = c.positive_int("num_experts")
        top_k = c["num_experts_per_tok"]
        if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= experts:
            raise c.refuse("num_experts_per_tok", f"it must be 1..num_experts = {experts}")
        dense = c["num_dense_layers"]
        if isinstance(dense, bool) or not isinstance(dense, int) or dense < 0:
            raise c.refuse("num_dense_layers", "it must be 0 or more")
        c.flag("use_expert_bias")
        c.positive_number("routed_scaling_factor")
        return c

    def layer_kinds(self, c: HFConfig) -> list[str]:
        if c["layer_types"] is None:  # Lfm2MoeConfig has no default for it
            raise c.refuse("layer_types", f"it must list num_hidden_layers = {c['num_hidden_layers']} entries "
                                          f"of {' or '.join(KINDS)}")
        return super().layer_kinds(c)

    def ffn(self, c: HFConfig, kinds: list[str]) -> dict:
        dense = glu_ffn("silu", c.positive_int("intermediate_size"), False)
        moe = {"kind": "moe", "experts": c["num_experts"], "top_k": c["num_experts_per_tok"],
               "expert": glu_ffn("silu", c.positive_int("moe_intermediate_size"), False),
               "router": {"kind": "sigmoid_grouped", "normalize": bool(c["norm_topk_prob"])},
               "routed_scale": float(c["routed_scaling_factor"]), "balance_loss": 0.0}
        first = min(c["num_dense_layers"], len(kinds))
        if first == len(kinds):
            return {"ffn": dense}
        return {"ffn": moe, "layer_overrides": {i: {"ffn": dense} for i in range(first)}}

    def ffn_rules(self, ours: str, theirs: str, ffn: dict, c: HFConfig) -> list[Rule]:
        if ffn["kind"] != "moe":
            return super().ffn_rules(ours, theirs, ffn, c)
        experts = ffn["experts"]
        bias = copy(ours + "router.correction_bias", theirs + "expert_bias") if c["use_expert_bias"] else \
            Rule(ours + "router.correction_bias", (), lambda: torch.zeros(experts), lambda bias: ())
        return [copy(ours + "router.weight", theirs + "gate.weight"), bias,
                *expert_rules(ours, theirs, experts, tuple(SWIGLU.values()))]

    # -- model -> config.json ------------------------------------------------------------------------
    @staticmethod
    def split(plans: list[LayerPlan]) -> tuple[list[dict], list[dict]]:
        """(the dense layers' FFNs, the sparse layers' mixtures), each in layer order."""
        return [p.ffn for p in plans if p.ffn is None or p.ffn["kind"] != "moe"], \
            [p.ffn for p in plans if p.ffn is not None and p.ffn["kind"] == "moe"]

    def ffn_problem(self, plans: list[LayerPlan]) -> str | None:
        dense, moes = self.split(plans)
        if not moes:
            return "model.ffn: no layer has experts; LFM2-MoE's layers after num_dense_layers do"
        moe, router, expert = moes[0], moes[0]["router"], moes[0]["expert"]
        return first_problem(
            (all(p.ffn is None or p.ffn["kind"] != "moe" for p in plans[:len(dense)]),
             "model.layer_overrides: LFM2-MoE's dense layers come first (num_dense_layers), then only experts"),
            (all(f == dense[0] for f in dense) and all(swiglu(f) for f in dense),
             "model.layer_overrides: LFM2-MoE's dense layers are one SwiGLU without biases"),
            (all(f == moe for f in moes), "model.layer_types: the mixtures of experts differ between layers"),
            (kind_of(router) == "sigmoid_grouped" and router["groups"] == 1,
             f"model.ffn.router is {kind_of(router)}; LFM2-MoE routes by sigmoid_grouped with one group"),
            (swiglu(expert), "model.ffn.expert: LFM2-MoE's experts are SwiGLU without biases"),
            (moe["shared"] is None and moe["capacity_factor"] is None,
             "model.ffn: LFM2-MoE has no shared expert and drops no token"),
        )

    def ffn_config(self, model: nn.Module, plans: list[LayerPlan]) -> dict:
        dense, moes = self.split(plans)
        moe = moes[0]
        return {"intermediate_size": model.decoder.blocks[0].ffn.hidden if dense else moe["expert"]["hidden"],
                "num_dense_layers": len(dense), "moe_intermediate_size": moe["expert"]["hidden"],
                "num_experts": moe["experts"], "num_experts_per_tok": moe["top_k"], "use_expert_bias": True,
                "routed_scaling_factor": moe["routed_scale"], "norm_topk_prob": moe["router"]["normalize"]}
