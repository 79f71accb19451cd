"""Nemotron-H (NVIDIA, 2025) <-> ``decoder_lm``: a stack whose every layer is one sublayer — a
Mamba-2 mixer, an attention mixer, a squared-ReLU MLP or a mixture of such experts — behind its
own RMSNorm: h ← h + f(n(h)). No position scheme (the attention is NoPE: the Mamba layers order
the tokens).

Layer kinds come from ``layers_block_type`` (``layer_types``; transformers 5) or, in older configs,
``hybrid_override_pattern`` (M Mamba-2, * attention, - MLP, E experts). The recipe gives the mixer
layers no FFN (``ffn: null``) and the FFN layers no mixer (``mixer: none``), as layer types in the
shortest repeating ``pattern``; ``backbone.layers.i.norm`` is the one norm of each.

- Mamba-2: ``mamba_num_heads`` heads of ``mamba_head_dim`` — the inner width is their product,
  whatever ``expand`` says (the 4B has 112 × 64 over 3072: the mixer's ``heads``) — ``n_groups``
  groups of ``ssm_state_size``, ``conv_kernel``, ``chunk_size``, ``use_bias`` on in/out_proj,
  ``use_conv_bias``, ``time_step_limit``; the gated norm (after the gate) normalises each group of
  E / ``n_groups`` channels with ``layer_norm_epsilon``. ``mamba_hidden_act`` must be silu.
- Attention: q/k/v/o without biases whatever ``attention_bias`` says, ``head_dim`` wide (128 by
  default, not C / H), GQA; transformers applies no ``sliding_window``, and neither does seqzoo.
- MLP: up_proj, relu² (``mlp_hidden_act``), down_proj, with ``mlp_bias``.
- Experts (DeepSeek-V3's router): sigmoid scores, ``e_score_correction_bias`` for the choice only,
  ``n_group`` groups of which ``topk_group`` are kept, top ``num_experts_per_tok``, renormalised if
  ``norm_topk_prob``, times ``routed_scaling_factor`` (``router: sigmoid_grouped``); the experts are
  ungated MLPs of ``moe_intermediate_size`` without biases, plus one shared MLP of
  ``moe_shared_expert_intermediate_size`` with ``mlp_bias``. ``moe_latent_size`` is refused.

``residual_in_fp32`` changes nothing transformers computes (its blocks add in the input dtype), and
multi-token-prediction weights (``mtp.*``) are left out, as transformers leaves them.
"""
from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

from torch import nn

from seqzoo.builder import layer_plan
from seqzoo.io.hf import (
    CausalLMConverter,
    Rule,
    copy,
    ffn_activation,
    first_problem,
    fused,
    kind_of,
    layer_pattern,
    linear,
    mlp_ffn,
    renamed,
    special_ids,
)
from seqzoo.io.hf.config import HFConfig
from seqzoo.registry import builtin

from ._hybrid_gguf import NEMOTRON_H
from ._mamba2 import NO_LIMIT, mixer_config, mixer_problem, mixer_rules, mixer_spec

#: NemotronHConfig's names of the Mamba-2 mixer's options, by seqzoo ``mamba2`` parameter.
NAMES = {"heads": "mamba_num_heads", "head_dim": "mamba_head_dim", "state": "ssm_state_size", "groups": "n_groups",
         "conv": "conv_kernel", "expand": "expand", "bias": "use_bias", "conv_bias": "use_conv_bias",
         "chunk": "chunk_size"}
#: Older names NemotronHConfig still reads, and wins with: {old: current}.
LEGACY = {"mamba_n_groups": "n_groups", "mamba_d_conv": "conv_kernel", "mamba_expand": "expand",
          "mamba_dt_limit": "time_step_limit", "mamba_conv_bias": "use_conv_bias", "mamba_chunk_size": "chunk_size"}
#: Layer kinds as config.json names them (transformers 5, legacy, pattern letters) -> the recipe's.
KINDS = {"linear_attention": "mamba", "mamba": "mamba", "full_attention": "attention", "attention": "attention",
         "mlp": "mlp", "moe": "moe"}
LETTERS = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
#: The recipe's kinds -> transformers 5's names and the pattern letters.
NAMED = {"mamba": ("linear_attention", "M"), "attention": ("full_attention", "*"), "mlp": ("mlp", "-"),
         "moe": ("moe", "E")}


@builtin("Hugging Face Nemotron-H <-> decoder_lm (layers of one sublayer each: Mamba-2, NoPE attention, relu² MLP "
         "or experts)")
class NemotronHConverter(CausalLMConverter):
    """config.json keys: hidden_size, layers_block_type (or hybrid_override_pattern),
    num_attention_heads, num_key_value_heads, head_dim, max_position_embeddings, attention_dropout,
    intermediate_size, mlp_hidden_act, mlp_bias, the Mamba-2 options above, mamba_hidden_act,
    layer_norm_epsilon, n_routed_experts, num_experts_per_tok, moe_intermediate_size,
    moe_shared_expert_intermediate_size, routed_scaling_factor, n_group, topk_group, norm_topk_prob,
    moe_latent_size, tie_word_embeddings."""

    model_type = "nemotron_h"
    named_only = True  # a plain Mamba-2 stack fits too; it stays a mamba2
    architecture = "NemotronHForCausalLM"
    base_prefix = "backbone."
    embedding = "backbone.embeddings.weight"
    dropped = {r"^mtp\.": "multi-token prediction layers"}
    gguf = NEMOTRON_H  # nemotron_h_moe where a layer has experts; layer kinds by per-layer KV heads and FFN widths
    defaults = {"vocab_size": 131072, "hidden_size": 4096, "layers_block_type": None, "tie_word_embeddings": False,
                "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 4096,
                "attention_dropout": 0.0, "intermediate_size": 21504, "mlp_hidden_act": "relu2", "mlp_bias": False,
                "ssm_state_size": 128, "mamba_num_heads": 128, "mamba_head_dim": 64, "mamba_hidden_act": "silu",
                "n_groups": 8, "conv_kernel": 4, "expand": 2, "time_step_limit": NO_LIMIT, "use_conv_bias": True,
                "chunk_size": 128, "use_bias": False, "n_routed_experts": 8, "moe_intermediate_size": 7688,
                "moe_shared_expert_intermediate_size": 7688, "moe_latent_size": None, "num_experts_per_tok": 2,
                "routed_scaling_factor": 1.0, "n_group": 1, "topk_group": 1, "norm_topk_prob": True,
                "initializer_range": 0.02, "layer_norm_epsilon": 1e-5}

    def config(self, config: dict) -> dict:
        c = HFConfig({**config, **{new: config[old] for old, new in LEGACY.items() if old in config}}, self.defaults)
        c["num_key_value_heads"] = c["num_key_value_heads"] or c["num_attention_heads"]
        c.positive_int("head_dim", why="NemotronHConfig sizes the attention heads by it")
        if c["mamba_hidden_act"] != "silu":
            raise c.refuse("mamba_hidden_act", "seqzoo's Mamba-2 mixer applies silu")
        if c["time_step_limit"] is None:  # transformers' PyTorch path cannot run it either
            raise c.refuse("time_step_limit", "write [0.0, Infinity] for no limit")
        if c["moe_latent_size"] is not None:
            raise c.refuse("moe_latent_size", "seqzoo's experts read and write the model width (null)")
        return c

    def layer_kinds(self, c: dict) -> list[str]:
        """``mamba``, ``attention``, ``mlp`` or ``moe`` for each layer, as NemotronHConfig reads them."""
        kinds = c["layers_block_type"] or c.get("layer_types")
        key = "layers_block_type"
        if not kinds and c.get("hybrid_override_pattern") is not None:
            key, pattern = "hybrid_override_pattern", c["hybrid_override_pattern"]
            kinds = [LETTERS.get(letter, letter) for letter in pattern] if isinstance(pattern, str) else pattern
        kinds = kinds or ["linear_attention", "moe", "full_attention", "mlp"]  # NemotronHConfig's default
        if not isinstance(kinds, list) or any(KINDS.get(k, LETTERS.get(k)) is None for k in kinds):
            raise c.refuse(key, f"each layer must be one of {', '.join(KINDS)} (letters {''.join(LETTERS)})")
        return [KINDS.get(k) or LETTERS[k] for k in kinds]

    def recipe(self, config: dict, names: Collection[str] = ()) -> dict:
        c = self.config(config)
        kinds = self.layer_kinds(c)
        dim, eps, heads, head_dim = c["hidden_size"], c["layer_norm_epsilon"], c["num_attention_heads"], c["head_dim"]
        act = c["mlp_hidden_act"]
        attention = {"heads": heads, "kv_heads": c["num_key_value_heads"], "score": "scaled_dot", "bias": False,
                     "out_bias": False, "window": None, "dropout": c["attention_dropout"]}
        if heads * head_dim != dim:
            attention["head_dim"] = head_dim
        types = {"mamba": {"ffn": None}, "attention": {"mixer": "attention", "ffn": None}, "mlp": {"mixer": "none"}}
        if "moe" in kinds:
            types["moe"] = {"mixer": "none", "ffn": {
                "kind": "moe", "experts": c["n_routed_experts"], "top_k": c["num_experts_per_tok"],
                "expert": mlp_ffn(act, c["moe_intermediate_size"], False, "config.json: mlp_hidden_act"),
                "router": {"kind": "sigmoid_grouped", "groups": c["n_group"], "topk_groups": c["topk_group"],
                           "normalize": c["norm_topk_prob"]},
                "shared": mlp_ffn(act, c["moe_shared_expert_intermediate_size"], c["mlp_bias"],
                                  "config.json: mlp_hidden_act"),
                "routed_scale": float(c["routed_scaling_factor"]), "balance_loss": 0.0}}
        return {"model": {
            "kind": "decoder_lm", "vocab_size": c["vocab_size"], "dim": dim, "layers": len(kinds),
            "max_seq_len": c["max_position_embeddings"], "position": "none", "norm": {"kind": "rmsnorm", "eps": eps},
            "placement": "pre", "attention": attention, "mixer": mixer_spec(c, NAMES, dim, eps, free_heads=True),
            "ffn": mlp_ffn(act, c["intermediate_size"], c["mlp_bias"], "config.json: mlp_hidden_act"),
            "layer_types": {k: types[k] for k in dict.fromkeys(kinds)}, "pattern": layer_pattern(kinds),
            # transformers never ties Nemotron-H's head (no tied-weights keys): a stored one is its own
            "tie_embeddings": c["tie_word_embeddings"] and "lm_head.weight" not in names,
            "init_std": c["initializer_range"],
        }}

    def aliases(self, config: dict, recipe: dict) -> dict[str, str]:
        return {}  # a stored head is the head, whatever tie_word_embeddings says

    @staticmethod
    def kind(plan) -> str:
        """The Nemotron-H kind of a layer plan (``mamba``, ``attention``, ``mlp``, ``moe``), or
        the mixer's kind when it is none of them."""
        if plan.mixer["kind"] == "none":
            return "moe" if plan.ffn["kind"] == "moe" else "mlp"
        return {"mamba2": "mamba", "attention": "attention"}.get(plan.mixer["kind"], f"mixer {plan.mixer['kind']}")

    def rules(self, config: dict, recipe: dict) -> list[Rule]:
        m = recipe["model"]
        rules = []
        for i, plan in enumerate(layer_plan(m)):
            b, h = f"decoder.blocks.{i}.", f"backbone.layers.{i}."
            kind = self.kind(plan)
            rules.append(copy(b + ("ffn_norm" if kind in ("mlp", "moe") else "mixer_norm") + ".weight",
                              h + "norm.weight"))
            if kind == "mamba":
                rules += mixer_rules(b + "mixer.", h + "mixer.", plan.mixer)
            elif kind == "attention":
                attn = plan.attention
                kv_heads, head_dim = attn.kv_heads or attn.heads, attn.head_dim or m["dim"] // attn.heads
                rules.append(fused(b + "mixer.qkv_proj.weight", tuple(f"{h}mixer.{x}_proj.weight" for x in "qkv"),
                                   (attn.heads * head_dim, kv_heads * head_dim, kv_heads * head_dim)))
                rules += linear(b + "mixer.out_proj", h + "mixer.o_proj", False)
            elif kind == "mlp":
                rules += renamed(b + "ffn.", h + "mixer.", {"up": "up_proj", "down": "down_proj"}, plan.ffn["bias"])
            else:
                ffn, ours, theirs = plan.ffn, b + "ffn.", h + "mixer."
                rules += [copy(ours + "router.weight", theirs + "gate.weight"),
                          copy(ours + "router.correction_bias", theirs + "gate.e_score_correction_bias")]
                for e in range(ffn["experts"]):
                    rules += renamed(f"{ours}experts.{e}.", f"{theirs}experts.{e}.",
                                     {"up": "up_proj", "down": "down_proj"}, False)
                rules += renamed(ours + "shared.", theirs + "shared_experts.", {"up": "up_proj", "down": "down_proj"},
                                 ffn["shared"]["bias"])
        ends = self.ends(recipe, "backbone.norm_f", False)
        if m["tie_embeddings"] and not config.get("tie_word_embeddings", False):  # an export: write the head out
            ends = [Rule("embed.weight", (self.embedding, "lm_head.weight"), lambda e, _: e, lambda t: (t, t))
                    if r.target == "embed.weight" else r for r in ends]
        return rules + ends

    def accepts(self, recipe: dict) -> str | None:
        m = recipe["model"]
        if m["kind"] != "decoder_lm":
            return f"model.kind is {m['kind']}, needs decoder_lm"
        plans = layer_plan(m)
        kinds = [self.kind(p) for p in plans]
        expected = {"mamba": ("mixer", "mamba2"), "attention": ("mixer", "attention"), "mlp": ("ffn", "mlp"),
                    "moe": ("ffn", "moe")}
        one_part = all(k in expected and (p.ffn is None) == (k in ("mamba", "attention")) for k, p in zip(kinds, plans))
        parts = {k: [p.mixer if k in ("mamba", "attention") else p.ffn for p, q in zip(plans, kinds) if q == k]
                 for k in expected}
        first = plans[0]
        mlps = parts["mlp"] + [f["shared"] for f in parts["moe"] if f["shared"] is not None]
        acts = {ffn_activation(f) for f in mlps + [f["expert"] for f in parts["moe"]]}
        problem = first_problem(
            (one_part, f"model.layer_types: a Nemotron-H layer is one of mamba2 without an FFN, attention without "
                       f"an FFN, or an mlp / moe FFN without a mixer (layers: {sorted(set(kinds))})"),
            (all(all(x == v[0] for x in v) for v in parts.values()),
             "model.layer_types: layers of one kind differ; Nemotron-H has one set of options per kind"),
            (all(replace(p, type=None, mixer={}, ffn=None) == replace(first, type=None, mixer={}, ffn=None)
                 for p in plans), "model.layer_types: Nemotron-H's layers differ only in their one sublayer"),
            (kind_of(first.norm) == "rmsnorm" and first.placement == "pre" and first.residual == "sequential",
             "model.norm: Nemotron-H is pre-norm RMSNorm with sequential residuals"),
            (kind_of(first.position) == "none", f"model.position is {kind_of(first.position)}; Nemotron-H has none"),
            (first.residual_multiplier == 1.0 and m["embedding_multiplier"] == 1.0 and m["logits_multiplier"] == 1.0,
             "model: Nemotron-H has no μP multipliers"),
            (m["embed_norm"] is None and not m["scale_embeddings"] and m["final_softcap"] is None,
             "model: Nemotron-H has no embedding norm, embedding scale or final softcap"),
            (all(a is not None and not a[1] for a in acts) and len(acts) <= 1,
             "model.ffn: Nemotron-H's MLPs and experts are ungated, with one activation (mlp_hidden_act)"),
            (len({f.get("bias") for f in mlps}) <= 1, "model.ffn: the MLPs and the shared expert differ in bias "
                                                  "(Nemotron-H has one mlp_bias)"),
        )
        if problem or "attention" in kinds and (problem := self.attention_problem(first.attention)):
            return problem
        if parts["moe"] and (problem := self.moe_problem(parts["moe"][0], mlps)):
            return problem
        return parts["mamba"] and mixer_problem(parts["mamba"][0], first.norm["eps"], "Nemotron-H",
                                                free_heads=True) or None

    @staticmethod
    def attention_problem(attn) -> str | None:
        return first_problem(
            (not attn.bias and not attn.out_bias, "model.attention: Nemotron-H's projections have no biases"),
            (attn.window is None and attn.qk_norm is None and attn.softcap is None and not attn.sinks
             and not attn.output_gate, "model.attention: Nemotron-H's is plain GQA (no window, QK-norm, softcap, "
                                       "sinks or gate)"),
            (kind_of(attn.score) == "scaled_dot" and attn.score.get("scale") is None,
             "model.attention.score must be scaled_dot with the default scale"),
        )

    @staticmethod
    def moe_problem(moe: dict, mlps: list) -> str | None:
        router, expert = moe["router"], moe["expert"]
        return first_problem(
            (kind_of(router) == "sigmoid_grouped", f"model.ffn.router is {kind_of(router)}; Nemotron-H routes by "
                                                   f"sigmoid_grouped (DeepSeek-V3's)"),
            (moe["shared"] is not None and not moe["shared_gate"], "model.ffn.shared: Nemotron-H has one ungated "
                                                                   "shared expert"),
            (kind_of(expert) == "mlp" and not expert.get("bias"), "model.ffn.expert: Nemotron-H's experts are "
                                                                  "ungated MLPs without biases"),
            (moe["capacity_factor"] is None, "model.ffn.capacity_factor is set; Nemotron-H drops no token"),
        )

    def hf_config(self, model: nn.Module) -> dict:
        m = model.recipe["model"]
        plans = layer_plan(m)
        kinds = [self.kind(p) for p in plans]
        by_kind = {k: p for p, k in zip(reversed(plans), reversed(kinds))}  # the first layer of each kind
        attn = plans[0].attention  # None when no layer attends and the recipe has no attention: section
        mlp = by_kind["mlp"].ffn if "mlp" in by_kind else None
        moe = by_kind["moe"].ffn if "moe" in by_kind else None
        mamba = by_kind["mamba"].mixer if "mamba" in by_kind else None
        shared = mlp or (moe and moe["shared"])
        out = {"vocab_size": m["vocab_size"], "hidden_size": m["dim"], "num_hidden_layers": m["layers"],
               "layers_block_type": [NAMED[k][0] for k in kinds],
               "hybrid_override_pattern": "".join(NAMED[k][1] for k in kinds),
               "attention_bias": False, "max_position_embeddings": m["max_seq_len"],
               "layer_norm_epsilon": plans[0].norm["eps"], "residual_in_fp32": False, "mamba_hidden_act": "silu",
               "tie_word_embeddings": False, "initializer_range": m["init_std"], **special_ids(model)}
        if attn is not None:
            out.update(num_attention_heads=attn.heads, num_key_value_heads=attn.kv_heads or attn.heads,
                       head_dim=attn.head_dim or m["dim"] // attn.heads, attention_dropout=attn.dropout)
        if shared is not None:
            out.update(mlp_hidden_act=ffn_activation(shared)[0], mlp_bias=shared["bias"])
        if mlp is not None:
            out["intermediate_size"] = mlp["hidden"]
        if moe is not None:
            router = moe["router"]
            out.update(n_routed_experts=moe["experts"], num_experts_per_tok=moe["top_k"],
                       moe_intermediate_size=moe["expert"]["hidden"],
                       moe_shared_expert_intermediate_size=moe["shared"]["hidden"], n_shared_experts=1,
                       routed_scaling_factor=moe["routed_scale"], n_group=router["groups"],
                       topk_group=router["topk_groups"] or router["groups"], norm_topk_prob=router["normalize"])
        if mamba is not None:
            out.update(mixer_config(mamba, NAMES, m["dim"]), mamba_proj_bias=mamba["bias"])
        return out
