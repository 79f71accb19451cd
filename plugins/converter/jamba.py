"""Jamba (Lieber et al., 2024) <-> ``decoder_lm``: a hybrid of Mamba and attention layers, with a
mixture of experts in some of them; pre-norm RMSNorm, no position scheme (the attention layers
have none: the Mamba layers order the tokens).

Layer i attends iff i % ``attn_layer_period`` = ``attn_layer_offset``, else it is a Mamba mixer;
its FFN is a mixture of experts iff i % ``expert_layer_period`` = ``expert_layer_offset`` (and
``num_experts`` > 1), else a dense SwiGLU. The recipe names the four combinations as layer types
(``mamba``, ``mamba_moe``, ``attention``, ``attention_moe``) in the shortest repeating ``pattern``.

- Mamba: Mamba-1's tensors under ``mamba.``, plus RMS norms with weights on Δ, B and C after
  ``x_proj`` (``dt_layernorm`` / ``b_layernorm`` / ``c_layernorm``, ε = ``rms_norm_eps``): the
  mixer's ``bcdt_norm_weights``. Padding is zeroed as in Mamba (see ``mamba``).
- Attention: q/k/v/o without biases, GQA, no RoPE.
- Experts: softmax top-k without renormalisation (``router: softmax_topk``, normalize: false),
  ``feed_forward.router`` and ``feed_forward.experts.e.*_proj``, each ``intermediate_size`` wide.
"""
from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import replace

from torch import nn

from seqzoo.builder import layer_plan
from seqzoo.errors import CheckpointError
from seqzoo.io.gguf import GGUFArch, Key, Transform
from seqzoo.io.gguf.arch import a_from_log, conv_squeezed, layer_period
from seqzoo.io.hf import (
    CausalLMConverter,
    Rule,
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
from seqzoo.registry import builtin

from ._moe import expert_rules, softmax_moe, softmax_moe_problem

GLU = {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}
MAMBA = ("in_proj", "conv1d", "x_proj", "dt_proj", "out_proj")


def period_offset(flags: list[bool]) -> tuple[int, int] | None:
    """The smallest (period, offset) with flags[i] ⇔ i % period = offset, or None."""
    n = len(flags)
    for period in range(1, n + 1):
        for offset in range(period):
            if all(f == (i % period == offset) for i, f in enumerate(flags)):
                return period, offset
    return None


#: llama.cpp's jamba metadata from config.json (the KV heads per layer and the inner width are derived).
JAMBA_KEYS = (Key("block_count", "num_hidden_layers"), Key("context_length", "max_position_embeddings"),
              Key("embedding_length", "hidden_size"), Key("feed_forward_length", "intermediate_size"),
              Key("attention.head_count", "num_attention_heads"), Key("ssm.conv_kernel", "mamba_d_conv"),
              Key("ssm.state_size", "mamba_d_state"), Key("ssm.time_step_rank", "mamba_dt_rank"),
              Key("attention.layer_norm_rms_epsilon", "rms_norm_eps", "f32"), Key("expert_count", "num_experts"),
              Key("expert_used_count", "num_experts_per_tok"))


def attention_kv_heads(config) -> list[int]:
    """KV heads per layer: the model's on attention layers, 0 on Mamba layers."""
    period, offset = config["attn_layer_period"], config["attn_layer_offset"]
    return [config["num_key_value_heads"] if i >= offset and (i - offset) % period == 0 else 0
            for i in range(config["num_hidden_layers"])]


def jamba_gguf_problem(config) -> str | None:
    if config["mamba_expand"] != 2:
        return f"llama.cpp's jamba needs Mamba layers of expansion 2; this model's is {config['mamba_expand']}"
    if config.get("mamba_proj_bias") or not config.get("mamba_conv_bias", True):
        return "llama.cpp's jamba has Mamba projections without biases and a conv with one; this model differs"
    if config["hidden_size"] % config["num_attention_heads"]:
        return "llama.cpp's jamba needs heads × head size = hidden size"
    return None


def jamba_gguf_config(get) -> dict:
    kv = list(get("attention.head_count_kv"))
    period, offset = layer_period([k > 0 for k in kv], "attention")
    return {"attn_layer_period": period, "attn_layer_offset": offset, "num_key_value_heads": max(kv),
            "mamba_expand": get("ssm.inner_size") // get("embedding_length"), "mamba_proj_bias": False,
            "mamba_conv_bias": True}


def jamba_gguf_experts(names) -> dict:
    layers = 1 + max(int(n.split(".")[1]) for n in names if n.startswith("blk."))
    period, offset = layer_period([f"blk.{i}.ffn_gate_inp.weight" in names for i in range(layers)], "expert")
    return {"expert_layer_period": period, "expert_layer_offset": offset}


@builtin("Hugging Face Jamba <-> decoder_lm (Mamba and attention layers, experts in every other layer)")
class JambaConverter(CausalLMConverter):
    """config.json keys: hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
    num_key_value_heads, hidden_act, rms_norm_eps, attn_layer_period/offset, expert_layer_period/
    offset, num_experts, num_experts_per_tok, router_aux_loss_coef, mamba_d_state, mamba_d_conv,
    mamba_expand, mamba_dt_rank, mamba_conv_bias, mamba_proj_bias, tie_word_embeddings."""

    model_type = "jamba"
    architecture = "JambaForCausalLM"
    # llama.cpp's jamba: which layers attend is the per-layer KV head count (0 on Mamba layers),
    # which are sparse is whether a layer has a router; the Mamba layers as llama.cpp's mamba's.
    gguf = GGUFArch("jamba", keys=JAMBA_KEYS, rope=False, problem=jamba_gguf_problem,
                    transforms=(Transform(r"A_log$", a_from_log), Transform(r"conv1d\.weight$", conv_squeezed)),
                    export=lambda c: {"attention.head_count_kv": attention_kv_heads(c),
                                      "ssm.inner_size": c["mamba_expand"] * c["hidden_size"]},
                    config=jamba_gguf_config, from_tensors=jamba_gguf_experts)
    base_prefix = "model."
    embedding = "model.embed_tokens.weight"
    defaults = {"vocab_size": 65536, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_act": "silu", "rms_norm_eps": 1e-6,
                "max_position_embeddings": 262144, "attention_dropout": 0.0, "num_experts": 16,
                "num_experts_per_tok": 2, "expert_layer_period": 2, "expert_layer_offset": 1, "attn_layer_period": 8,
                "attn_layer_offset": 4, "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2,
                "mamba_dt_rank": "auto", "mamba_conv_bias": True, "mamba_proj_bias": False,
                "router_aux_loss_coef": 0.001, "tie_word_embeddings": False, "initializer_range": 0.02}

    def config(self, config: dict) -> dict:
        c = HFConfig(config, self.defaults)
        c["num_key_value_heads"] = c["num_key_value_heads"] or c["num_attention_heads"]
        if c["mamba_dt_rank"] == "auto":
            c["mamba_dt_rank"] = math.ceil(c["hidden_size"] / 16)
        if c["hidden_act"] not in ("silu", "swish"):
            raise CheckpointError(f"config.json: hidden_act {c['hidden_act']!r} is not supported for jamba; its "
                                  f"Mamba mixers apply SiLU, as seqzoo's do")
        for key in ("attn_layer_period", "expert_layer_period"):
            c.positive_int(key)
        return c

    def kinds(self, c: dict) -> list[str]:
        """Each layer's type: mamba | attention, with _moe where its FFN is a mixture of experts."""
        out = []
        for i in range(c["num_hidden_layers"]):
            mixer = "attention" if i % c["attn_layer_period"] == c["attn_layer_offset"] else "mamba"
            sparse = c["num_experts"] > 1 and i % c["expert_layer_period"] == c["expert_layer_offset"]
            out.append(mixer + ("_moe" if sparse else ""))
        return out

    def recipe(self, config: dict, names: Collection[str] = ()) -> dict:
        c = self.config(config)
        dim, heads = c["hidden_size"], c["num_attention_heads"]
        eps = c["rms_norm_eps"]
        mamba = {"kind": "mamba", "state": c["mamba_d_state"], "conv": c["mamba_d_conv"], "expand": c["mamba_expand"],
                 "dt_rank": c["mamba_dt_rank"], "bias": c["mamba_proj_bias"], "conv_bias": c["mamba_conv_bias"],
                 "bcdt_norm_eps": eps, "bcdt_norm_weights": True}
        expert = glu_ffn(c["hidden_act"], c["intermediate_size"], False)
        moe = softmax_moe(c["num_experts"], c["num_experts_per_tok"], expert, normalize=False,
                          balance=c["router_aux_loss_coef"])
        types = {"mamba": {}, "mamba_moe": {"ffn": moe}, "attention": {"mixer": "attention"},
                 "attention_moe": {"mixer": "attention", "ffn": moe}}
        kinds = self.kinds(c)
        attention = {"heads": heads, "kv_heads": c["num_key_value_heads"], "bias": False, "out_bias": False,
                     "dropout": c["attention_dropout"]}
        return {"model": {
            "kind": "decoder_lm", "vocab_size": c["vocab_size"], "dim": dim, "layers": c["num_hidden_layers"],
            "max_seq_len": c["max_position_embeddings"], "position": "none", "norm": {"kind": "rmsnorm", "eps": eps},
            "placement": "pre", "attention": attention, "mixer": mamba, "ffn": expert,
            "layer_types": {k: types[k] for k in dict.fromkeys(kinds)}, "pattern": layer_pattern(kinds),
            "tie_embeddings": c["tie_word_embeddings"], "init_std": c["initializer_range"],
        }}

    def rules(self, config: dict, recipe: dict) -> list[Rule]:
        rules = []
        for i, plan in enumerate(layer_plan(recipe["model"])):
            b, h = f"decoder.blocks.{i}.", f"model.layers.{i}."
            rules += renamed(b, h, {"mixer_norm": "input_layernorm", "ffn_norm": "pre_ff_layernorm"}, False)
            if plan.mixer["kind"] == "mamba":
                spec = plan.mixer
                biases = (spec["bias"], spec["conv_bias"], False, True, spec["bias"])
                for part, bias in zip(MAMBA, biases):
                    rules += linear(f"{b}mixer.{part}", f"{h}mamba.{part}", bias)
                rules += [Rule(f"{b}mixer.{p}", (f"{h}mamba.{p}",)) for p in ("A_log", "D")]
                rules += [Rule(f"{b}mixer.{ours}_norm", (f"{h}mamba.{theirs}_layernorm.weight",))
                          for ours, theirs in (("dt", "dt"), ("b", "b"), ("c", "c"))]
            else:
                attn = plan.attention
                kv_heads, head_dim = attn.kv_heads or attn.heads, attn.head_dim or recipe["model"]["dim"] // attn.heads
                sources = tuple(f"{h}self_attn.{x}_proj.weight" for x in "qkv")
                rules.append(fused(f"{b}mixer.qkv_proj.weight", sources,
                                   (attn.heads * head_dim, kv_heads * head_dim, kv_heads * head_dim)))
                rules += linear(b + "mixer.out_proj", h + "self_attn.o_proj", False)
            if plan.ffn["kind"] == "moe":
                rules.append(Rule(b + "ffn.router.weight", (h + "feed_forward.router.weight",)))
                rules += expert_rules(b + "ffn.", h + "feed_forward.", plan.ffn["experts"])
            else:
                rules += renamed(b + "ffn.", h + "feed_forward.", GLU, False)
        return rules + self.ends(recipe, "model.final_layernorm", False)

    def accepts(self, recipe: dict) -> str | None:
        m = recipe["model"]
        if m["kind"] != "decoder_lm":
            return f"model.kind is {m['kind']}, needs decoder_lm"
        plans = layer_plan(m)
        if plans[0].attention is None:
            return "model.attention is null; Jamba's attention layers need its settings"
        attends = [p.mixer["kind"] == "attention" for p in plans]
        sparse = [p.ffn is not None and p.ffn["kind"] == "moe" for p in plans]
        mambas = [p.mixer for p in plans if p.mixer["kind"] == "mamba"]
        moes = [p.ffn for p, s in zip(plans, sparse) if s]
        denses = [p.ffn for p, s in zip(plans, sparse) if not s]
        alike = [replace(p, type=None, mixer={}, ffn=None) for p in plans]
        first = plans[0]
        attn = first.attention
        eps = first.norm.get("eps")
        return first_problem(
            ({p.mixer["kind"] for p in plans} <= {"mamba", "attention"}, "model.mixer: Jamba's layers are mamba "
                                                                           "or attention"),
            (all(p == alike[0] for p in alike), "model.layer_types: Jamba's layers differ only in mixer and FFN"),
            (period_offset(attends) is not None or not any(attends),
             "model.pattern: Jamba's attention layers repeat with one period and offset"),
            (period_offset(sparse) is not None or not any(sparse),
             "model.pattern: Jamba's expert layers repeat with one period and offset"),
            (all(s == mambas[0] for s in mambas), "model.layer_types: Jamba's Mamba layers are alike"),
            (not mambas or (mambas[0]["bcdt_norm_weights"] and mambas[0]["bcdt_norm_eps"] == eps),
             "model.mixer: Jamba's Mamba normalises Δ, B and C with weights and model.norm's eps"),
            (all(f == moes[0] for f in moes) and all(f == denses[0] for f in denses),
             "model.layer_types: the FFNs of one kind differ"),
            (all(ffn_activation(f) == ("silu", True) and not f.get("bias") for f in denses),
             "model.ffn must be swiglu without biases"),
            (not moes or softmax_moe_problem(moes[0], "Jamba", normalize=False) is None,
             moes and softmax_moe_problem(moes[0], "Jamba", normalize=False)),
            (not moes or not denses or moes[0]["expert"]["hidden"] == (denses[0] or {}).get("hidden"),
             "model.ffn: Jamba's experts are as wide as its dense FFN"),
            (kind_of(first.position) == "none", f"model.position is {kind_of(first.position)}; Jamba has none"),
            (kind_of(first.norm) == "rmsnorm" and first.placement == "pre" and first.residual == "sequential",
             "model.norm: Jamba is pre-norm RMSNorm with sequential residuals"),
            (not attn.bias and not attn.out_bias and attn.window is None and attn.qk_norm is None
             and attn.softcap is None and not attn.sinks and not attn.output_gate
             and kind_of(attn.score) == "scaled_dot"
             and attn.score.get("scale") is None, "model.attention: Jamba's is plain GQA without biases"),
            (m["embed_norm"] is None and not m["scale_embeddings"] and m["final_softcap"] is None,
             "model: Jamba has no embedding norm, embedding scale or final softcap"),
        )

    def hf_config(self, model: nn.Module) -> dict:
        m = model.recipe["model"]
        plans = layer_plan(m)
        n = m["layers"]
        attends = [p.mixer["kind"] == "attention" for p in plans]
        sparse = [p.ffn["kind"] == "moe" for p in plans]
        attn_po, expert_po = period_offset(attends) or (n + 1, n), period_offset(sparse) or (n + 1, n)
        mamba = next((p.mixer for p in plans if p.mixer["kind"] == "mamba"), m["mixer"])
        moe = next((p.ffn for p in plans if p.ffn["kind"] == "moe"), None)
        dense = next((p.ffn for p in plans if p.ffn["kind"] != "moe"), None) or moe["expert"]
        attn = plans[0].attention
        return {"vocab_size": m["vocab_size"], "hidden_size": m["dim"], "intermediate_size": dense["hidden"],
                "num_hidden_layers": n, "num_attention_heads": attn.heads,
                "num_key_value_heads": attn.kv_heads or attn.heads, "hidden_act": "silu",
                "rms_norm_eps": m["norm"]["eps"], "max_position_embeddings": m["max_seq_len"],
                "attention_dropout": attn.dropout, "attn_layer_period": attn_po[0], "attn_layer_offset": attn_po[1],
                "expert_layer_period": expert_po[0], "expert_layer_offset": expert_po[1],
                "num_experts": moe["experts"] if moe else 1, "num_experts_per_tok": moe["top_k"] if moe else 1,
                "router_aux_loss_coef": moe["balance_loss"] if moe else 0.001,
                "mamba_d_state": mamba["state"], "mamba_d_conv": mamba["conv"], "mamba_expand": mamba["expand"],
                "mamba_dt_rank": mamba["dt_rank"] or math.ceil(m["dim"] / 16), "mamba_conv_bias": mamba["conv_bias"],
                "mamba_proj_bias": mamba["bias"], "tie_word_embeddings": m["tie_embeddings"],
                "initializer_range": m["init_std"], **special_ids(model)}
