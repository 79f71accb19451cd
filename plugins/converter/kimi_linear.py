"""Kimi Linear (Kimi Team, 2025, "Kimi Linear: An Expressive, Efficient Attention Architecture") <->
``decoder_lm``: Kimi Delta Attention layers (``mixer: kda``, docs/formulas.md §15.5) and, at the
layers ``linear_attn_config.full_attn_layers`` names, multi-head latent attention without positions
(``mixer: mla`` under ``position: none``); a dense SwiGLU in the first ``first_k_dense_replace``
layers and DeepSeek-V3's mixture of experts with a shared expert in the rest; pre-norm RMSNorm.

- KDA (``_kda``): H, D and K from ``linear_attn_config``; its conv runs through ``hidden_act``: silu.
- MLA (``_mla``; ``mla_use_nope``): DeepSeek's layout; the ``qk_rope_head_dim`` key part is still one
  key shared by the heads, only never rotated; scale (d_n + d_r)^−½; the latent norms' ε 1e-6.
- Experts (``block_sparse_moe``): ``router: sigmoid_grouped`` — σ scores, ``e_score_correction_bias``
  for the choice only, ``num_expert_group`` groups of which ``topk_group`` are kept, renormalised
  by ``moe_renormalize``, scaled by ``routed_scaling_factor`` — over ``experts.e.w1/w3/w2``, and
  ``shared_experts`` (``num_shared_experts`` · ``moe_intermediate_size`` wide, unweighted).

Which layers attend: ``layer_types`` if listed, else ``linear_attn_config.full_attn_layers`` (numbered
from 1), else every fourth from layer 4 (transformers' default); which are dense: ``mlp_layer_types``,
else the first ``first_k_dense_replace`` (1). The checkpoint's names for the experts' options
(``num_experts``, ``num_experts_per_token``, ``num_shared_experts``, ``moe_renormalize``,
``num_expert_group``, ``model_max_length``) and transformers' (``num_local_experts``,
``num_experts_per_tok``, ``n_shared_experts``, ``norm_topk_prob``, ``n_group``,
``max_position_embeddings``) are both read. Keys whose other values transformers would silently
run as these are refused: ``mla_use_nope`` false, ``moe_router_activation_func`` other than
sigmoid, ``moe_layer_freq`` other than 1. Dense layers come in as ``mlp.`` (Moonshot's checkpoints)
or ``block_sparse_moe.`` (what transformers writes) and go out as ``mlp.``. transformers never ties
the head to the embedding: a stored head is imported as its own, and a tied model is exported with
its head written out.
"""
from __future__ import annotations

import re
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
    glu_ffn,
    kind_of,
    renamed,
    special_ids,
)
from seqzoo.io.hf.config import HFConfig
from seqzoo.registry import builtin

from . import _kda, _mla
from ._kda import LINEAR_KEYS
from ._kimi_gguf import KIMI_LINEAR
from ._moe import expert_rules

MLA_EPS = 1e-6  # KimiLinearRMSNorm's default, used by q_a_layernorm and kv_a_layernorm
GLU = {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}
FULL, LINEAR = "full_attention", "linear_attention"
#: The checkpoint's names of the options transformers also reads under its own (its attribute_map).
ALIASES = {"num_experts": "num_local_experts", "num_experts_per_token": "num_experts_per_tok",
           "num_shared_experts": "n_shared_experts", "moe_renormalize": "norm_topk_prob",
           "num_expert_group": "n_group", "model_max_length": "max_position_embeddings"}
#: Keys transformers does not read, and the one value of each it computes.
FIXED = {"mla_use_nope": True, "moe_router_activation_func": "sigmoid", "moe_layer_freq": 1}


def layout(kinds: list[str]) -> dict:
    """``pattern`` and ``layer_overrides`` for per-layer type names: the period with the fewest
    entries plus exceptions (Kimi-Linear-48B's 27 layers: [kda, kda, kda, mla] and two overrides)."""
    best = None
    for period in range(1, len(kinds) + 1):
        pattern = [max(kinds[r::period], key=kinds[r::period].count) for r in range(period)]
        overrides = {i: k for i, k in enumerate(kinds) if k != pattern[i % period]}
        if best is None or period + len(overrides) < len(best[0]) + len(best[1]):
            best = pattern, overrides
    pattern, overrides = best
    return {"pattern": pattern, **({"layer_overrides": overrides} if overrides else {})}


@builtin("Hugging Face Kimi Linear <-> decoder_lm (KDA and NoPE latent-attention layers, DeepSeek-V3's experts "
         "with a shared one, dense first layers)")
class KimiLinearConverter(CausalLMConverter):
    """config.json keys: hidden_size, num_hidden_layers, num_attention_heads, q_lora_rank,
    kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, attention_bias, rms_norm_eps,
    hidden_act, intermediate_size, moe_intermediate_size, routed_scaling_factor, topk_group,
    first_k_dense_replace, layer_types, mlp_layer_types, linear_attn_config, tie_word_embeddings and
    the aliased options above; rope_theta, use_grouped_topk and num_key_value_heads change nothing
    transformers computes."""

    model_type = "kimi_linear"
    architecture = "KimiLinearForCausalLM"
    gguf = KIMI_LINEAR
    base_prefix = "model."
    embedding = "model.embed_tokens.weight"
    defaults = {"vocab_size": 163840, "hidden_size": 2304, "intermediate_size": 9216, "moe_intermediate_size": 1024,
                "num_hidden_layers": 27, "num_attention_heads": 32, "num_shared_experts": 1,
                "routed_scaling_factor": 2.446, "kv_lora_rank": 512, "q_lora_rank": None, "qk_rope_head_dim": 64,
                "v_head_dim": 128, "qk_nope_head_dim": 128, "num_expert_group": 1, "topk_group": 1,
                "num_experts_per_token": 8, "moe_renormalize": True, "hidden_act": "silu",
                "model_max_length": 1048576, "initializer_range": 0.02, "rms_norm_eps": 1e-5,
                "tie_word_embeddings": False, "attention_bias": False, "attention_dropout": 0.0, "num_experts": 256,
                "linear_num_heads": 32, "linear_head_dim": 128, "linear_conv_kernel_dim": 4,
                "first_k_dense_replace": 1, "layer_types": None, "mlp_layer_types": None, **FIXED}

    def config(self, config: dict) -> HFConfig:
        c = HFConfig(config)
        for ours, theirs in ALIASES.items():
            if ours in config and theirs in config and config[ours] != config[theirs]:
                raise c.refuse(theirs, f"config.json also says {ours} {config[ours]!r}; they name one option")
            if theirs in config:
                c[ours] = config[theirs]
        linear = config.get("linear_attn_config") or {}
        for key, name in LINEAR_KEYS.items():
            if key in linear:
                c[name] = linear[key]
        c = HFConfig({**self.defaults, **c})
        for key, value in FIXED.items():
            if c[key] != value:
                raise c.refuse(key, f"transformers runs Kimi Linear as if it were {value!r}")
        if c["hidden_act"] != "silu":
            raise c.refuse("hidden_act", "the KDA convs and the MLPs take their activation from it, and seqzoo's "
                                         "KDA conv uses silu; it must be silu")
        if c["attention_dropout"]:
            raise c.refuse("attention_dropout", "seqzoo's latent attention has no dropout; it must be 0")
        for key in ("num_hidden_layers", "num_attention_heads", "kv_lora_rank", "qk_nope_head_dim",
                    "qk_rope_head_dim", "v_head_dim", *LINEAR_KEYS.values()):
            c.positive_int(key)
        n = c["num_hidden_layers"]
        c["layer_types"] = self.listed(c, "layer_types", (LINEAR, FULL), linear, n)
        c["mlp_layer_types"] = self.listed(c, "mlp_layer_types", ("dense", "sparse"), linear, n)
        if "sparse" in c["mlp_layer_types"]:
            for key in ("num_experts", "num_experts_per_token", "moe_intermediate_size"):
                c.positive_int(key)
            c.positive_int("num_shared_experts", why="Kimi Linear's experts sit beside a shared expert "
                                                     "(transformers builds one whatever it says)")
        return c

    @staticmethod
    def listed(c: HFConfig, key: str, kinds: tuple[str, str], linear: dict, n: int) -> list[str]:
        """``layer_types`` or ``mlp_layer_types`` as transformers derives it when config.json lists none."""
        value = c[key]
        if value is None and key == "layer_types" and "full_attn_layers" in linear and "kda_layers" in linear:
            full = set(linear["full_attn_layers"])
            value = [FULL if i + 1 in full else LINEAR for i in range(n)]
            if sorted(full | set(linear["kda_layers"])) != list(range(1, n + 1)):
                raise c.refuse("linear_attn_config", f"its full_attn_layers and kda_layers must number the layers "
                                                     f"1..{n} between them", linear)
        elif value is None and key == "layer_types":
            value = [FULL if i and i % 4 == 0 else LINEAR for i in range(n)]
        elif value is None:
            value = ["dense" if i < c["first_k_dense_replace"] else "sparse" for i in range(n)]
        if not isinstance(value, list) or len(value) != n or any(k not in kinds for k in value):
            raise c.refuse(key, f"it must list {n} entries, each {kinds[0]} or {kinds[1]}", value)
        return value

    def recipe(self, config: dict, names: Collection[str] = ()) -> dict:
        c = self.config(config)
        dim, act = c["hidden_size"], c["hidden_act"]
        kda = _kda.mixer_spec(c, c["rms_norm_eps"])
        mla = {"kind": "mla", "heads": c["num_attention_heads"], "q_lora_rank": c["q_lora_rank"],
               "kv_lora_rank": c["kv_lora_rank"], "qk_nope_head_dim": c["qk_nope_head_dim"],
               "qk_rope_head_dim": c["qk_rope_head_dim"], "v_head_dim": c["v_head_dim"],
               "bias": c["attention_bias"], "norm_eps": MLA_EPS}
        dense = glu_ffn(act, c.positive_int("intermediate_size"), False)
        sparse = [k == "sparse" for k in c["mlp_layer_types"]]
        moe = None
        if any(sparse):
            moe = {"kind": "moe", "experts": c["num_experts"], "top_k": c["num_experts_per_token"],
                   "expert": glu_ffn(act, c["moe_intermediate_size"], False),
                   "router": {"kind": "sigmoid_grouped", "groups": c["num_expert_group"],
                              "topk_groups": c["topk_group"], "normalize": c.flag("moe_renormalize")},
                   "shared": glu_ffn(act, c["moe_intermediate_size"] * c["num_shared_experts"], False),
                   "routed_scale": float(c["routed_scaling_factor"]), "balance_loss": 0.0}
        kinds = [("mla" if t == FULL else "kda") + ("_dense" if moe and not s else "")
                 for t, s in zip(c["layer_types"], sparse)]
        types = {k: {**({"mixer": mla} if k.startswith("mla") else {}), **({"ffn": dense} if "_" in k else {})}
                 for k in dict.fromkeys(kinds)}
        return {"model": {
            "kind": "decoder_lm", "vocab_size": c["vocab_size"], "dim": dim, "layers": c["num_hidden_layers"],
            "max_seq_len": c["model_max_length"], "position": "none",
            "norm": {"kind": "rmsnorm", "eps": c["rms_norm_eps"]}, "placement": "pre",
            "attention": {"heads": c["num_attention_heads"]},  # unused: the layers are KDA and MLA
            "mixer": kda, "ffn": moe or dense, "layer_types": types, **layout(kinds),
            # transformers never ties Kimi Linear's head (no tied-weights keys): a stored one is its own
            "tie_embeddings": c.flag("tie_word_embeddings") and "lm_head.weight" not in names,
            "init_std": c["initializer_range"]}}

    def aliases(self, config: dict, recipe: dict) -> dict[str, str]:
        return {}  # a stored head is the head, whatever tie_word_embeddings says

    def canonical_names(self, names: Collection[str]) -> dict[str, str]:
        """A dense layer's MLP as transformers writes it (``block_sparse_moe.gate_proj``) is ``mlp.``."""
        dense = re.compile(r"\.block_sparse_moe\.(?=(gate|up|down)_proj\.)")
        return {dense.sub(".mlp.", k): v for k, v in super().canonical_names(names).items()}

    def rules(self, config: dict, recipe: dict) -> list[Rule]:
        rules = []
        for i, plan in enumerate(layer_plan(recipe["model"])):
            b, h = f"decoder.blocks.{i}.", f"model.layers.{i}."
            ours, theirs, spec = b + "mixer.", h + "self_attn.", plan.mixer
            rules += renamed(b, h, {"mixer_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}, False)
            rules += _kda.mixer_rules(ours, theirs, spec, recipe["model"]["dim"]) if spec["kind"] == "kda" else \
                _mla.mixer_rules(ours, theirs, spec)
            if plan.ffn["kind"] == "moe":
                ours, theirs = b + "ffn.", h + "block_sparse_moe."
                rules += [copy(ours + "router.weight", theirs + "gate.weight"),
                          copy(ours + "router.correction_bias", theirs + "gate.e_score_correction_bias"),
                          *expert_rules(ours, theirs, plan.ffn["experts"], ("w1", "w3", "w2")),
                          *renamed(ours + "shared.", theirs + "shared_experts.", GLU, False)]
            else:
                rules += renamed(b + "ffn.", h + "mlp.", GLU, False)
        ends = self.ends(recipe, "model.norm", False)
        if recipe["model"]["tie_embeddings"] and not config.get("tie_word_embeddings", False):  # an export
            ends = [Rule("embed.weight", (self.embedding, "lm_head.weight"), lambda e, _: e, lambda t: (t, t))
                    if r.target == "embed.weight" else r for r in ends]  # the head written out
        return rules + ends

    def accepts(self, recipe: dict) -> str | None:
        m = recipe["model"]
        if m["kind"] != "decoder_lm":
            return f"model.kind is {m['kind']}, needs decoder_lm"
        plans = layer_plan(m)
        first = plans[0]
        kdas = [p.mixer for p in plans if p.mixer["kind"] == "kda"]
        mlas = [p.mixer for p in plans if p.mixer["kind"] == "mla"]
        moes = [p.ffn for p in plans if p.ffn is not None and p.ffn["kind"] == "moe"]
        denses = [p.ffn for p in plans if p.ffn is None or p.ffn["kind"] != "moe"]
        alike = [replace(p, type=None, mixer={}, ffn=None) for p in plans]
        eps = first.norm.get("eps")
        return first_problem(
            (len(kdas) + len(mlas) == len(plans), "model.mixer: Kimi Linear's layers are kda or mla"),
            (all(s == kdas[0] for s in kdas) and all(s == mlas[0] for s in mlas),
             "model.layer_types: Kimi Linear's KDA layers are alike, and its MLA layers"),
            (all(p == alike[0] for p in alike), "model.layer_types: Kimi Linear's layers differ only in mixer and FFN"),
            (all(f == denses[0] for f in denses) and all(f == moes[0] for f in moes),
             "model.layer_types: the FFNs of one kind differ"),
            (all(f is not None and kind_of(f) == "swiglu" and not f["bias"] for f in denses),
             "model.ffn: Kimi Linear's dense FFNs are swiglu without biases"),
            (kind_of(first.norm) == "rmsnorm", f"model.norm is {kind_of(first.norm)}, needs rmsnorm"),
            (first.placement == "pre" and first.residual == "sequential" and first.mixer_norm
             and first.residual_multiplier == 1.0, "model: Kimi Linear is pre-norm with sequential residuals"),
            (kind_of(first.position) == "none", f"model.position is {kind_of(first.position)}; Kimi Linear has none"),
            (m["embed_norm"] is None and not m["scale_embeddings"] and m["final_softcap"] is None
             and m["embedding_multiplier"] == 1.0 and m["logits_multiplier"] == 1.0,
             "model: Kimi Linear has no embedding norm or scale, final softcap or multipliers"),
        ) or (kdas and _kda.mixer_problem(kdas[0], m["dim"], eps, "Kimi Linear")) \
            or (mlas and self.mla_problem(mlas[0])) or (moes and self.moe_problem(moes[0])) or None

    @staticmethod
    def mla_problem(spec: dict) -> str | None:
        qk = spec["qk_nope_head_dim"] + spec["qk_rope_head_dim"]
        return first_problem(
            (spec["norm_eps"] == MLA_EPS and spec["latent_norm"],
             f"model.layer_types: Kimi Linear's MLA normalises its latent with ε {MLA_EPS}"),
            (spec["scale"] is None or abs(spec["scale"] - qk ** -0.5) <= 1e-9 * qk ** -0.5,
             "model.layer_types: Kimi Linear's MLA scales its scores by (d_n + d_r)^-1/2"),
        )

    @staticmethod
    def moe_problem(spec: dict) -> str | None:
        router, expert, shared = spec["router"], spec["expert"], spec["shared"]
        return first_problem(
            (kind_of(router) == "sigmoid_grouped", f"model.ffn.router is {kind_of(router)}, needs sigmoid_grouped"),
            (ffn_activation(expert) == ("silu", True) and kind_of(expert) == "swiglu" and not expert["bias"],
             "model.ffn.expert must be swiglu without biases"),
            (shared is not None and kind_of(shared) == "swiglu" and not shared["bias"]
             and shared["hidden"] % expert["hidden"] == 0,
             "model.ffn.shared must be a swiglu a whole number of experts wide (Kimi Linear has one)"),
            (not spec["shared_gate"] and spec["capacity_factor"] is None,
             "model.ffn: Kimi Linear has no shared gate and drops no token"),
        )

    def hf_config(self, model: nn.Module) -> dict:
        m = model.recipe["model"]
        plans = layer_plan(m)
        kda = next((p.mixer for p in plans if p.mixer["kind"] == "kda"), None)
        mla = next((p.mixer for p in plans if p.mixer["kind"] == "mla"), None)
        moe = next((p.ffn for p in plans if p.ffn["kind"] == "moe"), None)
        dense = next((i for i, p in enumerate(plans) if p.ffn["kind"] != "moe"), None)
        full = [i + 1 for i, p in enumerate(plans) if p.mixer["kind"] == "mla"]
        linear = {"full_attn_layers": full, "kda_layers": [i for i in range(1, len(plans) + 1) if i not in full]}
        linear.update(_kda.mixer_config(kda, m["dim"]) if kda is not None else {})
        out = {"vocab_size": m["vocab_size"], "hidden_size": m["dim"], "num_hidden_layers": m["layers"],
               "model_max_length": m["max_seq_len"], "rms_norm_eps": m["norm"]["eps"], "hidden_act": "silu",
               "linear_attn_config": linear, **{LINEAR_KEYS[k]: v for k, v in linear.items() if k in LINEAR_KEYS},
               "layer_types": [FULL if p.mixer["kind"] == "mla" else LINEAR for p in plans],
               "mlp_layer_types": ["sparse" if p.ffn["kind"] == "moe" else "dense" for p in plans],
               "intermediate_size": self.defaults["intermediate_size"] if dense is None else
               model.decoder.blocks[dense].ffn.hidden,
               **FIXED, "tie_word_embeddings": False, "initializer_range": m["init_std"],
               **special_ids(model)}
        out.update(_mla.mixer_config(mla) if mla is not None else {})
        if moe is not None:
            out.update(num_experts=moe["experts"], num_experts_per_token=moe["top_k"],
                       moe_intermediate_size=moe["expert"]["hidden"],
                       num_shared_experts=moe["shared"]["hidden"] // moe["expert"]["hidden"],
                       num_expert_group=moe["router"]["groups"],
                       topk_group=moe["router"]["topk_groups"] or moe["router"]["groups"],
                       moe_renormalize=moe["router"]["normalize"], routed_scaling_factor=moe["routed_scale"])
        first_k = sum(p.ffn["kind"] != "moe" for p in plans)
        if out["mlp_layer_types"] == ["dense"] * first_k + ["sparse"] * (len(plans) - first_k):
            out["first_k_dense_replace"] = first_k  # the original config's form, where it has one
        return out
