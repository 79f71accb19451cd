"""MiniMax-01 (MiniMax, 2025, "MiniMax-01: Scaling Foundation Models with Lightning Attention";
MiniMax-Text-01) <-> ``decoder_lm``: lightning-attention and softmax-attention layers, each with a
mixture of experts, in MiniMax's post-norm layout with scaled residuals.

transformers' ``MiniMaxDecoderLayer`` keeps the *normed* input as the residual:

    h = n₁(x);  y = α_a·h + β_a·mixer(h);  z = n₂(y);  out = α_m·z + β_m·MoE(z)

and the next layer's n₁ (after the last, ``model.norm``) normalises ``out``. Read from the embedding
on, that is a post-norm stack — s ← n(α·s + β·F(s)) after every sublayer — behind an embedding
norm (layer 0's ``input_layernorm``). An RMSNorm of α·v with ε is an RMSNorm of v with ε / α², so
seqzoo's post-norm block with ``residual_multiplier`` β / α and norms of ε / α² is the same layer
exactly: ``mixer_norm`` is layer i's ``post_attention_layernorm``, ``ffn_norm`` layer i + 1's
``input_layernorm`` (the last layer's: ``model.norm``), ``embed_norm`` layer 0's, with
``rms_norm_eps``. This needs one α and one β for every sublayer: ``full_attn_*``, ``linear_attn_*``
and ``mlp_*`` ``alpha_factor`` / ``beta_factor`` must agree for the kinds a model has (MiniMax-Text-01's
do: α = (2·80)^¼ ≈ 3.557, β = 1).

- Layers: ``layer_types`` (``linear_attention`` / ``full_attention``; transformers' default
  alternates, starting with full) as layer types in the shortest repeating ``pattern``; MiniMax's
  remote-code ``attn_type_list`` (1 = full) must agree with them.
- Lightning attention (``mixer: gla`` with MiniMax's options, docs/formulas.md §15.6): ``qkv_proj``
  (rows per head, reordered by ``minimax_layout``) and ``output_gate`` stacked into ``in_proj``; SiLU
  on q, k, v (``hidden_act``), a fixed decay per head scaled by depth — each layer's
  ``decay_scale`` = ``minimax_decay_scale(i, L)`` through ``layer_overrides``; an RMSNorm (ε 10⁻⁶)
  over all H·D, then σ(``output_gate``); chunk = ``block_size``. Its decay buffers (``slope_rate``,
  ``query_decay``, ``key_decay``, ``diagonal_decay``) follow from the config and are not read.
- Softmax attention: q/k/v/o without biases, GQA, RoPE rotating whole heads (θ 10⁶ by default),
  ``sliding_window`` if set.
- MoE: softmax over ``num_local_experts`` router logits (``block_sparse_moe.gate``), the top
  ``num_experts_per_tok`` renormalised; experts ``w1`` / ``w3`` / ``w2`` (gate / up / down).
  ``router_jitter_noise`` only acts while training and must be 0.

Padding: MiniMax zeroes q, k, v at padded positions but still decays its state there; seqzoo leaves
the state as it was. From a zero state (a left-padded prompt) the two agree; they differ only when a
cached state precedes padding (a batch extended with padded tokens after its prompt).
"""
from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import replace

import torch
from torch import nn

from seqzoo.builder import layer_plan
from seqzoo.io.hf import (
    CausalLMConverter,
    Rule,
    copy,
    ffn_activation,
    first_problem,
    fused,
    glu_ffn,
    kind_of,
    layer_pattern,
    linear,
    renamed,
    special_ids,
)
from seqzoo.io.hf.config import HFConfig
from seqzoo.io.hf.rope import rope_config, rope_problem, rope_spec
from seqzoo.nn.attention import AttentionConfig
from seqzoo.plugins.mixer.gla import minimax_decay_scale, minimax_layout
from seqzoo.registry import builtin

from ._moe import expert_rules, softmax_moe, softmax_moe_problem

#: Per-layer kinds as config.json names them -> the recipe's layer types.
KINDS = {"linear_attention": "lightning", "full_attention": "attention"}
#: Each sublayer's residual factors: config.json's keys, and MiniMax's remote-code names of them.
FACTORS = {"attention": ("full_attn", "layernorm_full_attention"),
           "lightning": ("linear_attn", "layernorm_linear_attention"), "mlp": ("mlp", "layernorm_mlp")}
LIGHTNING_NORM_EPS = 1e-6  # MiniMaxRMSNorm's default, which the lightning layer's norm keeps
DEFAULT_THETA = 1e6  # MiniMaxConfig.default_theta


def lightning_spec(heads: int, head_dim: int, chunk: int) -> dict:
    """MiniMax's lightning attention as a ``gla`` spec (its decay_scale set per layer)."""
    return {"kind": "gla", "heads": heads, "head_dim": head_dim, "value_head_dim": head_dim, "decay": "head_fixed",
            "feature_map": "silu", "scale": 1.0, "norm": "whole", "gate": "sigmoid", "norm_eps": LIGHTNING_NORM_EPS,
            "chunk": chunk}


def lightning_rule(target: str, theirs: str, heads: int, head_dim: int) -> Rule:
    """``in_proj`` = [``qkv_proj`` rows by kind; ``output_gate``], and back."""
    rows, width = minimax_layout(heads, head_dim), 3 * heads * head_dim
    back = torch.argsort(rows)
    return Rule(target, (theirs + "qkv_proj.weight", theirs + "output_gate.weight"),
                lambda qkv, gate: torch.cat([qkv[rows], gate]), lambda w: (w[:width][back], w[width:]))


@builtin("Hugging Face MiniMax <-> decoder_lm (lightning and softmax attention layers, experts, scaled post-norm "
         "residuals)")
class MiniMaxConverter(CausalLMConverter):
    """config.json keys: vocab_size, hidden_size, intermediate_size (an expert's width),
    num_hidden_layers, layer_types, num_attention_heads, num_key_value_heads, head_dim, hidden_act,
    max_position_embeddings, rms_norm_eps, rope_parameters (or rope_theta + rope_scaling),
    sliding_window, attention_dropout, num_local_experts, num_experts_per_tok, router_aux_loss_coef,
    router_jitter_noise (0), block_size, the six {full_attn, linear_attn, mlp}_{alpha, beta}_factor,
    tie_word_embeddings; output_router_logits changes nothing seqzoo computes."""

    model_type = "minimax"
    architecture = "MiniMaxForCausalLM"
    base_prefix = "model."
    embedding = "model.embed_tokens.weight"
    ignored = (r"rotary_emb\.\w*inv_freq$", r"self_attn\.(slope_rate|query_decay|key_decay|diagonal_decay)$")
    defaults = {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": None, "hidden_act": "silu",
                "max_position_embeddings": 4096 * 32, "initializer_range": 0.02, "rms_norm_eps": 1e-5,
                "tie_word_embeddings": False, "sliding_window": None, "attention_dropout": 0.0,
                "num_experts_per_tok": 2, "num_local_experts": 8, "router_aux_loss_coef": 0.001,
                "router_jitter_noise": 0.0, "layer_types": None, "block_size": 256,
                **{f"{key}_{part}_factor": 1 for key, _ in FACTORS.values() for part in ("alpha", "beta")}}

    def config(self, config: dict) -> dict:
        c = HFConfig(config, self.defaults)
        if "num_experts" in config and "num_local_experts" not in config:  # MiniMaxConfig's attribute_map
            c["num_local_experts"] = config["num_experts"]
        n, dim, heads = (c.positive_int(k) for k in ("num_hidden_layers", "hidden_size", "num_attention_heads"))
        c["num_key_value_heads"] = c["num_key_value_heads"] or heads
        c["head_dim"] = c["head_dim"] or dim // heads
        c["layer_types"] = c["layer_types"] or ["full_attention" if i % 2 == 0 else "linear_attention"
                                                for i in range(n)]
        if not isinstance(c["layer_types"], list) or len(c["layer_types"]) != n or \
                any(k not in KINDS for k in c["layer_types"]):
            raise c.refuse("layer_types", f"it must list num_hidden_layers = {n} entries of {', '.join(KINDS)}")
        kinds = [KINDS[k] for k in c["layer_types"]]
        if "attn_type_list" in c and c["attn_type_list"] != [int(k == "attention") for k in kinds]:
            raise c.refuse("attn_type_list", "it must agree with layer_types (1 = full_attention), which "
                                             "transformers reads")
        if c.get("postnorm") is False:
            raise c.refuse("postnorm", "transformers' MiniMax keeps the normed input as the residual (true)")
        if c["router_jitter_noise"]:
            raise c.refuse("router_jitter_noise", "seqzoo's router adds no training noise (set it to 0.0)")
        if "lightning" in kinds and c["hidden_act"] not in ("silu", "swish"):
            raise c.refuse("hidden_act", "the lightning layers apply it to q, k and v, and seqzoo's apply silu")
        factors = {}
        for kind in ("mlp", *dict.fromkeys(kinds)):
            key, legacy = FACTORS[kind]
            for part in ("alpha", "beta"):
                name = f"{key}_{part}_factor"
                if f"{legacy}_{part}" in c and c[f"{legacy}_{part}"] != c[name]:
                    raise c.refuse(f"{legacy}_{part}", f"it must agree with {name} {c[name]}, which transformers "
                                                       f"reads")
                factors[name] = c.positive_number(name)
        for part in ("alpha", "beta"):
            mlp = factors[f"mlp_{part}_factor"]
            other = next((k for k, v in factors.items() if f"_{part}_" in k and v != mlp), None)
            if other is not None:
                raise c.refuse(other, f"seqzoo's post-norm block scales both sublayers of a layer alike: it must "
                                      f"equal mlp_{part}_factor {mlp}")
        c["alpha"], c["beta"] = factors["mlp_alpha_factor"], factors["mlp_beta_factor"]
        c["kinds"] = kinds
        return c

    def recipe(self, config: dict, names: Collection[str] = ()) -> dict:
        c = self.config(config)
        kinds, n, dim = c["kinds"], c["num_hidden_layers"], c["hidden_size"]
        heads, head_dim, eps = c["num_attention_heads"], c["head_dim"], c["rms_norm_eps"]
        attention = {"heads": heads, "kv_heads": c["num_key_value_heads"], "score": "scaled_dot", "bias": False,
                     "out_bias": False, "window": c["sliding_window"], "dropout": c["attention_dropout"]}
        if head_dim * heads != dim:
            attention["head_dim"] = head_dim
        position = rope_spec({**config, "rope_theta": config.get("rope_theta", DEFAULT_THETA)}, head_dim,
                             c["max_position_embeddings"])
        expert = glu_ffn(c["hidden_act"], c.positive_int("intermediate_size"), False)
        model = {"kind": "decoder_lm", "vocab_size": c["vocab_size"], "dim": dim, "layers": n,
                 "max_seq_len": c["max_position_embeddings"], "position": position,
                 "norm": {"kind": "rmsnorm", "eps": eps / c["alpha"] ** 2}, "placement": "post",
                 "embed_norm": {"kind": "rmsnorm", "eps": eps}, "residual_multiplier": c["beta"] / c["alpha"],
                 "attention": attention,
                 "ffn": softmax_moe(c["num_local_experts"], c["num_experts_per_tok"], expert, normalize=True,
                                    balance=c["router_aux_loss_coef"]),
                 "tie_embeddings": c["tie_word_embeddings"], "init_std": c["initializer_range"]}
        if "lightning" in kinds:
            model["mixer"] = lightning_spec(heads, head_dim, c["block_size"])
            model["layer_overrides"] = {i: {"mixer": {"decay_scale": minimax_decay_scale(i, n)}}
                                        for i, kind in enumerate(kinds) if kind == "lightning"}
            if "attention" in kinds:
                types = {"lightning": {}, "attention": {"mixer": "attention"}}
                model.update(layer_types={k: types[k] for k in dict.fromkeys(kinds)}, pattern=layer_pattern(kinds))
        return {"model": model}

    def rules(self, config: dict, recipe: dict) -> list[Rule]:
        m = recipe["model"]
        plans = layer_plan(m)
        rules = [copy("embed.weight", self.embedding),
                 copy("decoder.embed_norm.weight", "model.layers.0.input_layernorm.weight")]
        for i, plan in enumerate(plans):
            b, h = f"decoder.blocks.{i}.", f"model.layers.{i}."
            after = f"model.layers.{i + 1}.input_layernorm" if i + 1 < len(plans) else "model.norm"
            rules += renamed(b, "", {"mixer_norm": h + "post_attention_layernorm", "ffn_norm": after}, False)
            if plan.mixer["kind"] == "gla":
                spec = plan.mixer
                rules.append(lightning_rule(b + "mixer.in_proj.weight", h + "self_attn.", spec["heads"],
                                            spec["head_dim"]))
                rules += renamed(b + "mixer.", h + "self_attn.", {"norm": "norm", "out_proj": "out_proj"}, False)
            else:
                attn = plan.attention
                kv_heads, head_dim = attn.kv_heads or attn.heads, attn.head_dim or m["dim"] // attn.heads
                rules.append(fused(b + "mixer.qkv_proj.weight", tuple(f"{h}self_attn.{x}_proj.weight" for x in "qkv"),
                                   (attn.heads * head_dim, kv_heads * head_dim, kv_heads * head_dim)))
                rules += linear(b + "mixer.out_proj", h + "self_attn.o_proj", False)
            rules.append(copy(b + "ffn.router.weight", h + "block_sparse_moe.gate.weight"))
            rules += expert_rules(b + "ffn.", h + "block_sparse_moe.", plan.ffn["experts"], ("w1", "w3", "w2"))
        return rules + ([] if m["tie_embeddings"] else [copy("lm_head.weight", "lm_head.weight")])

    def accepts(self, recipe: dict) -> str | None:
        m = recipe["model"]
        if m["kind"] != "decoder_lm":
            return f"model.kind is {m['kind']}, needs decoder_lm"
        plans = layer_plan(m)
        first, n = plans[0], len(plans)
        embed_norm, moe = m["embed_norm"], first.ffn
        problem = first_problem(
            ({p.mixer["kind"] for p in plans} <= {"gla", "attention"},
             "model.mixer: MiniMax's layers are gla (lightning attention) or attention"),
            (all(replace(p, type=None, mixer={}, attention=None) == replace(first, type=None, mixer={}, attention=None)
                 for p in plans), "model.layer_types: MiniMax's layers differ only in their mixer"),
            (first.placement == "post" and first.residual == "sequential" and first.mixer_norm,
             "model.placement must be post (MiniMax keeps the normed input as the residual)"),
            (kind_of(first.norm) == "rmsnorm" and kind_of(embed_norm) == "rmsnorm",
             "model.norm and model.embed_norm must be rmsnorm (MiniMax's first input_layernorm is the embed norm)"),
            (moe is not None and moe["kind"] == "moe",
             f"model.ffn is {kind_of(moe)}; every MiniMax layer is a mixture of experts"),
            (m["final_softcap"] is None and not m["scale_embeddings"] and m["embedding_multiplier"] == 1.0
             and m["logits_multiplier"] == 1.0, "model: MiniMax has no softcap, embedding scale or μP multipliers"),
        )
        if problem:
            return problem
        attn, lightning = self.attention(plans), [(i, p.mixer) for i, p in enumerate(plans) if p.mixer["kind"] == "gla"]
        heads, kv_heads, head_dim, chunk = self.shape(m, plans)
        want = lightning_spec(heads, head_dim, chunk)  # gate_rank and gate_normalizer: unused by fixed decays
        act = ffn_activation(moe["expert"])
        return first_problem(
            (all({k: s[k] for k in want} == want for _, s in lightning),
             "model.mixer: MiniMax's lightning attention is gla with decay head_fixed, feature_map silu, scale 1, "
             "norm whole, gate sigmoid, norm_eps 1e-6, heads and head widths as the attention's, one chunk"),
            (all(math.isclose(s["decay_scale"], minimax_decay_scale(i, n), rel_tol=1e-12) for i, s in lightning),
             "model.layer_overrides: a lightning layer's decay_scale is not minimax_decay_scale(layer, layers)"),
            (softmax_moe_problem(moe, "MiniMax", normalize=True) is None,
             softmax_moe_problem(moe, "MiniMax", normalize=True)),
            (act is not None and (act[0] == "silu" or not lightning),
             "model.ffn.expert: MiniMax's hidden_act is also the lightning layers' feature map, silu"),
            (all(p.attention == attn for p in plans if p.mixer["kind"] == "attention"),
             "model.layer_types: MiniMax's attention layers are alike"),
            (attn is None or kind_of(first.position) == "rope", f"model.position is {kind_of(first.position)}, "
                                                                 f"needs rope"),
            (attn is None or (kind_of(attn.score) == "scaled_dot" and attn.score.get("scale") is None),
             "model.attention.score must be scaled_dot with the default scale"),
            (attn is None or (not attn.bias and not attn.out_bias), "model.attention: MiniMax has no biases"),
            (attn is None or (attn.qk_norm is None and attn.softcap is None and not attn.sinks
                              and not attn.output_gate), "model.attention: MiniMax's attention is plain GQA"),
        ) or (rope_problem(first.position, m["max_seq_len"], head_dim) if attn is not None else None)

    @staticmethod
    def attention(plans: list) -> AttentionConfig | None:
        """The attention layers' section, or None when no layer attends."""
        return next((p.attention for p in plans if p.mixer["kind"] == "attention"), None)

    def shape(self, m: dict, plans: list) -> tuple[int, int, int, int]:
        """(heads, kv heads, head width, chunk) as config.json states them: the attention layers'
        and the lightning layers' (which have no GQA) agree; the chunk is the latter's block_size."""
        attn = self.attention(plans)
        spec = next((p.mixer for p in plans if p.mixer["kind"] == "gla"), None)
        chunk = spec["chunk"] if spec is not None else self.defaults["block_size"]
        if attn is None:
            return spec["heads"], spec["heads"], spec["head_dim"], chunk
        return attn.heads, attn.kv_heads or attn.heads, attn.head_dim or m["dim"] // attn.heads, chunk

    def hf_config(self, model: nn.Module) -> dict:
        m = model.recipe["model"]
        plans = layer_plan(m)
        first, attn = plans[0], self.attention(plans)
        heads, kv_heads, head_dim, chunk = self.shape(m, plans)
        eps = m["embed_norm"]["eps"]
        alpha = math.sqrt(eps / first.norm["eps"])  # the block's norms have ε / α² (see the module's docstring)
        beta = first.residual_multiplier * alpha
        position = first.position if kind_of(first.position) == "rope" else {"kind": "rope", "base": DEFAULT_THETA,
                                                                              "scaling": None}
        moe = first.ffn
        return {"vocab_size": m["vocab_size"], "hidden_size": m["dim"],
                "intermediate_size": model.decoder.blocks[0].ffn.experts.hidden,
                "num_hidden_layers": len(plans), "num_attention_heads": heads, "num_key_value_heads": kv_heads,
                "head_dim": head_dim, "hidden_act": ffn_activation(moe["expert"])[0],
                "max_position_embeddings": m["max_seq_len"], "rms_norm_eps": eps,
                **rope_config(position, m["max_seq_len"]),
                "layer_types": ["linear_attention" if p.mixer["kind"] == "gla" else "full_attention" for p in plans],
                "sliding_window": attn.window if attn is not None else None,
                "attention_dropout": attn.dropout if attn is not None else 0.0,
                "block_size": chunk,
                "num_local_experts": moe["experts"], "num_experts_per_tok": moe["top_k"],
                "router_aux_loss_coef": moe["balance_loss"], "router_jitter_noise": 0.0,
                **{f"{key}_alpha_factor": alpha for key, _ in FACTORS.values()},
                **{f"{key}_beta_factor": beta for key, _ in FACTORS.values()},
                "tie_word_embeddings": m["tie_embeddings"], "initializer_range": m["init_std"], **special_ids(model)}
