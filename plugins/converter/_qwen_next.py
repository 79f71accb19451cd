"""What the Qwen3-Next and Qwen3.5 converters share (not a family of their own): one converter for
the layers all three have — gated delta and gated attention by ``layer_types``, (1 + w) RMSNorm,
partial RoPE, dense or mixture-of-experts FFNs — that each family specialises by its ``layout``
of the gated-delta projections and its FFN rule (``sparse_layers``, ``normalized``,
``ffn_problem``, ``ffn_config``). The families' docstrings say what each reads."""
from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import replace
from typing import ClassVar

from torch import nn

from seqzoo.builder import layer_plan
from seqzoo.io.hf import (
    CausalLMConverter,
    Rule,
    ffn_activation,
    first_problem,
    glu_ffn,
    kind_of,
    layer_pattern,
    renamed,
    special_ids,
)
from seqzoo.io.hf.config import HFConfig
from seqzoo.io.hf.rope import partial_factor, rope_config, rope_problem, rope_spec

from ._gated_delta import (
    FULL,
    GLU,
    LINEAR,
    attention_problem,
    attention_rules,
    layer_kinds,
    mixer_config,
    mixer_problem,
    mixer_rules,
    mixer_spec,
    model_problem,
)
from ._moe import expert_rules, softmax_moe, softmax_moe_problem

PARTIAL = 0.25  # the partial_rotary_factor of Qwen3-Next and Qwen3.5 when config.json names none
NORM = "gemma_rmsnorm"  # x̂ · (1 + w): Qwen3-Next's zero-centred RMSNorm
#: Qwen3NextConfig's defaults (Qwen3-Next-80B-A3B's shape, says its docstring).
DEFAULTS = {"vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 48,
            "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256, "hidden_act": "silu",
            "max_position_embeddings": 32768, "initializer_range": 0.02, "rms_norm_eps": 1e-6,
            "tie_word_embeddings": False, "attention_bias": False, "attention_dropout": 0.0,
            "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
            "linear_num_key_heads": 16, "linear_num_value_heads": 32, "decoder_sparse_step": 1,
            "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "num_experts_per_tok": 10,
            "num_experts": 512, "norm_topk_prob": True, "router_aux_loss_coef": 0.001, "mlp_only_layers": [],
            "layer_types": None}


def interval_kinds(c: HFConfig) -> Callable[[int], list[str]]:
    """The layer kinds when config.json lists none: full attention at every
    ``full_attention_interval``-th layer (4), gated delta elsewhere."""
    interval = c.positive_int("full_attention_interval") if "full_attention_interval" in c else 4
    return lambda n: [FULL if (i + 1) % interval == 0 else LINEAR for i in range(n)]


class QwenNextFamily(CausalLMConverter):
    """Qwen3-Next's converter; the Qwen3.5 families change their layout and FFN rule."""

    base_prefix = "model."
    embedding = "model.embed_tokens.weight"
    ignored = (r"rotary_emb\.\w*inv_freq$",)
    dropped = {r"^mtp\.": "the multi-token-prediction layer"}
    defaults: ClassVar[dict] = DEFAULTS
    #: How a gated-delta layer stores its input projections (``_gated_delta``).
    layout: ClassVar[str] = "grouped"
    #: The family's name in messages.
    name: ClassVar[str] = "Qwen3-Next"

    def config(self, config: dict) -> HFConfig:
        c = HFConfig(config, self.defaults)
        c["num_key_value_heads"] = c["num_key_value_heads"] or c["num_attention_heads"]
        c["head_dim"] = c["head_dim"] or c["hidden_size"] // c["num_attention_heads"]
        return c

    # -- the FFN, which the Qwen3.5 families decide otherwise -------------------------------------
    def sparse_layers(self, c: HFConfig) -> list[bool]:
        """Whether each layer's FFN is the mixture of experts."""
        step, only = c.positive_int("decoder_sparse_step"), set(c["mlp_only_layers"] or [])
        return [c["num_experts"] > 0 and i not in only and (i + 1) % step == 0
                for i in range(c["num_hidden_layers"])]

    def moe_spec(self, c: HFConfig) -> dict:
        for key in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size"):
            c.positive_int(key)
        expert = glu_ffn("silu", c["moe_intermediate_size"], False)
        return softmax_moe(c["num_experts"], c["num_experts_per_tok"], expert,
                           normalize=self.normalized(c), balance=c["router_aux_loss_coef"],
                           shared=glu_ffn("silu", c["shared_expert_intermediate_size"], False), shared_gate=True)

    def normalized(self, c: HFConfig) -> bool:
        """Whether the router renormalises the top-k weights."""
        return c.flag("norm_topk_prob")

    def ffn_problem(self, sparse: list[bool], moe: dict | None) -> str | None:
        """Why these sparse layers (and this mixture, if any) have no form in the family, or None."""
        if moe is None:  # num_experts 0 would say it, but that model is a Qwen3.5 and goes there
            return "model.ffn: no layer has experts; Qwen3-Next without them is Qwen3.5 (qwen3_5_text)"
        return self.moe_problem(moe)

    def moe_problem(self, moe: dict) -> str | None:
        """Why a ``moe`` spec is not the family's mixture with its gated shared expert, or None."""
        swiglu = [ffn_activation(f) == ("silu", True) and not f["bias"] for f in (moe["expert"], moe["shared"] or {})
                  if f]
        return softmax_moe_problem(moe, self.name, shared=True) or first_problem(
            (all(swiglu), f"model.ffn: {self.name}'s experts and shared expert are SwiGLUs without biases"),
            (moe["shared_gate"], f"model.ffn.shared_gate is false; {self.name} gates its shared expert"),
        )

    def ffn_config(self, sparse: list[bool], moe: dict | None, widths: dict) -> dict:
        """config.json's FFN keys (``widths``: the built FFNs' widths, see ``widths``)."""
        dense = [i for i, s in enumerate(sparse) if not s]
        out = {"intermediate_size": widths.get("intermediate_size", self.defaults["intermediate_size"]),
               "num_experts": 0, "decoder_sparse_step": 1, "mlp_only_layers": dense}
        if moe:
            out.update(self.moe_config(moe, widths), norm_topk_prob=moe["router"]["normalize"])
        return out

    @staticmethod
    def moe_config(moe: dict, widths: dict) -> dict:
        return {"num_experts": moe["experts"], "num_experts_per_tok": moe["top_k"],
                "moe_intermediate_size": widths["moe_intermediate_size"],
                "shared_expert_intermediate_size": widths["shared_expert_intermediate_size"],
                "router_aux_loss_coef": moe["balance_loss"]}

    @staticmethod
    def widths(model: nn.Module, sparse: list[bool]) -> dict:
        """The built FFNs' widths under their config keys (a recipe may leave ``hidden`` to its rule)."""
        blocks, out = model.decoder.blocks, {}
        if not all(sparse):
            out["intermediate_size"] = blocks[sparse.index(False)].ffn.hidden
        if any(sparse):
            ffn = blocks[sparse.index(True)].ffn
            out.update(moe_intermediate_size=ffn.experts.hidden, shared_expert_intermediate_size=ffn.shared.hidden)
        return out

    # -- the converter interface ------------------------------------------------------------------
    def recipe(self, config: dict, names: Collection[str] = ()) -> dict:
        c = self.config(config)
        kinds, sparse = layer_kinds(c, interval_kinds(c)), self.sparse_layers(c)
        dim, heads, head_dim, eps = c["hidden_size"], c["num_attention_heads"], c["head_dim"], c["rms_norm_eps"]
        params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
        params.setdefault("partial_rotary_factor", config.get("partial_rotary_factor", PARTIAL))
        position = rope_spec({**config, "rope_parameters": params, "rope_scaling": None}, head_dim,
                             c["max_position_embeddings"], partial=True)
        attention = {"heads": heads, "kv_heads": c["num_key_value_heads"], "score": "scaled_dot",
                     "bias": c["attention_bias"], "window": None,
                     "dropout": c["attention_dropout"], "qk_norm": {"kind": NORM, "eps": eps}, "qk_norm_scope": "head",
                     "output_gate": True}
        if head_dim * heads != dim:
            attention["head_dim"] = head_dim
        dense = glu_ffn("silu", c.positive_int("intermediate_size"), False) if not all(sparse) else None
        moe = self.moe_spec(c) if any(sparse) else None
        per_layer = [kind + ("_dense" if moe and not s else "") for kind, s in zip(kinds, sparse)]
        types = {name: {**({} if name.startswith(LINEAR) else {"mixer": "attention"}),
                        **({"ffn": dense} if name.endswith("_dense") else {})} for name in dict.fromkeys(per_layer)}
        return {"model": {
            "kind": "decoder_lm", "vocab_size": c["vocab_size"], "dim": dim, "layers": c["num_hidden_layers"],
            "max_seq_len": c["max_position_embeddings"], "position": position, "norm": {"kind": NORM, "eps": eps},
            "placement": "pre", "attention": attention, "mixer": mixer_spec(c, norm_eps=eps), "ffn": moe or dense,
            "layer_types": types, "pattern": layer_pattern(per_layer), "tie_embeddings": c["tie_word_embeddings"],
            "init_std": c["initializer_range"]}}

    def rules(self, config: dict, recipe: dict) -> list[Rule]:
        m = recipe["model"]
        rules = []
        for i, plan in enumerate(layer_plan(m)):
            b, h = f"decoder.blocks.{i}.", f"model.layers.{i}."
            rules += renamed(b, h, {"mixer_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}, False)
            if plan.mixer["kind"] == "gated_deltanet":
                rules += mixer_rules(b + "mixer.", h + "linear_attn.", plan.mixer, m["dim"], self.layout)
            else:
                rules += attention_rules(b + "mixer.", h + "self_attn.", plan.attention, m["dim"])
            if plan.ffn["kind"] == "moe":
                ours, theirs = b + "ffn.", h + "mlp."
                rules += [Rule(ours + "router.weight", (theirs + "gate.weight",)),
                          *expert_rules(ours, theirs, plan.ffn["experts"]),
                          *renamed(ours + "shared.", theirs + "shared_expert.", GLU, False),
                          Rule(ours + "shared_gate.weight", (theirs + "shared_expert_gate.weight",))]
            else:
                rules += renamed(b + "ffn.", h + "mlp.", GLU, False)
        return rules + self.ends(recipe, "model.norm", False)

    def accepts(self, recipe: dict) -> str | None:
        m = recipe["model"]
        if m["kind"] != "decoder_lm":
            return f"model.kind is {m['kind']}, needs decoder_lm"
        plans = layer_plan(m)
        first, family = plans[0], self.name
        deltas = [p.mixer for p in plans if p.mixer["kind"] == "gated_deltanet"]
        attn = next((p.attention for p in plans if p.mixer["kind"] == "attention"), first.attention)
        sparse = [p.ffn is not None and p.ffn["kind"] == "moe" for p in plans]
        moes = [p.ffn for p, s in zip(plans, sparse) if s]
        denses = [p.ffn for p, s in zip(plans, sparse) if not s]
        alike = [replace(p, type=None, mixer={}, ffn=None) for p in plans]
        eps = first.norm.get("eps")
        return first_problem(
            ({p.mixer["kind"] for p in plans} <= {"gated_deltanet", "attention"},
             f"model.mixer: {family}'s layers are gated_deltanet or attention"),
            (all(d == deltas[0] for d in deltas), f"model.layer_types: {family}'s gated-delta layers are alike"),
            (all(p == alike[0] for p in alike), f"model.layer_types: {family}'s layers differ only in mixer and FFN"),
            (attn is not None, f"model.attention is null; {family}'s config.json describes its attention layers"),
            (kind_of(first.norm) == NORM, f"model.norm is {kind_of(first.norm)}, needs {NORM} ({family}'s (1 + w))"),
            (first.placement == "pre" and first.residual == "sequential" and first.mixer_norm,
             f"model: {family} is pre-norm with sequential residuals"),
            (first.residual_multiplier == 1.0, f"model.residual_multiplier must be 1 for {family}"),
            (kind_of(first.position) == "rope", f"model.position is {kind_of(first.position)}, needs rope"),
            (all(f == denses[0] for f in denses) and all(f == moes[0] for f in moes),
             "model.layer_types: the FFNs of one kind differ"),
            (all(f is not None and ffn_activation(f) == ("silu", True) and not f["bias"] for f in denses),
             "model.ffn must be swiglu without biases"),
        ) or attention_problem(attn, family, qk_norm=NORM, scope="head", eps=eps, gated=True) \
            or rope_problem(first.position, m["max_seq_len"], attn.head_dim or m["dim"] // attn.heads, partial=True) \
            or (mixer_problem(deltas[0], family, norm_eps=eps, eps_source="rms_norm_eps") if deltas else None) \
            or self.ffn_problem(sparse, moes[0] if moes else None) or model_problem(m, family)

    def hf_config(self, model: nn.Module) -> dict:
        m = model.recipe["model"]
        plans = layer_plan(m)
        first = plans[0]
        attn = next((p.attention for p in plans if p.mixer["kind"] == "attention"), first.attention)
        head_dim = attn.head_dim or m["dim"] // attn.heads
        delta = next((p.mixer for p in plans if p.mixer["kind"] == "gated_deltanet"), None)
        sparse = [p.ffn["kind"] == "moe" for p in plans]
        moe = next((p.ffn for p in plans if p.ffn["kind"] == "moe"), None)
        rope = rope_config(first.position, m["max_seq_len"])
        factor = partial_factor(first.position.get("rotary_dim") or head_dim, head_dim)
        for key in ("rope_parameters", "rope_scaling"):  # named: the family's default is 0.25
            if rope[key] is not None:
                rope[key]["partial_rotary_factor"] = factor
        linear = mixer_config(delta, m["dim"]) if delta else {}
        return {"vocab_size": m["vocab_size"], "hidden_size": m["dim"], "num_hidden_layers": m["layers"],
                "num_attention_heads": attn.heads, "num_key_value_heads": attn.kv_heads or attn.heads,
                "head_dim": head_dim, "hidden_act": "silu", "max_position_embeddings": m["max_seq_len"],
                "rms_norm_eps": first.norm["eps"], **rope, "attention_bias": attn.bias,
                "attention_dropout": attn.dropout, "layer_types": [LINEAR if p.mixer["kind"] == "gated_deltanet"
                                                                  else FULL for p in plans],
                **linear, **self.ffn_config(sparse, moe, self.widths(model, sparse)),
                "tie_word_embeddings": m["tie_embeddings"], "initializer_range": m["init_std"], **special_ids(model)}


#: What a Qwen3.5 checkpoint holds beside the language model, which seqzoo leaves out.
DROPPED = {r"^mtp\.": "the multi-token-prediction layer", r"^model\.visual\.": "the vision tower"}
LANGUAGE_MODEL = "model.language_model."
#: Qwen3_5TextConfig's defaults (Qwen3-Next's without the experts).
QWEN3_5_DEFAULTS = {**{k: v for k, v in DEFAULTS.items() if "expert" not in k and k not in (
    "decoder_sparse_step", "norm_topk_prob", "mlp_only_layers", "router_aux_loss_coef", "moe_intermediate_size")},
    "vocab_size": 248320, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 32,
    "num_key_value_heads": 4}


class Qwen3_5Family(QwenNextFamily):
    """Qwen3-Next's converter with Qwen3.5's projections and checkpoint names (both Qwen3.5s)."""

    layout: ClassVar[str] = "split"
    dropped = DROPPED

    def canonical_names(self, names: Collection[str]) -> dict[str, str]:
        """A vision-language checkpoint's language model ``model.language_model.*`` is ``model.*``."""
        if any(n.startswith(LANGUAGE_MODEL) for n in names):
            return {"model." + n.removeprefix(LANGUAGE_MODEL) if n.startswith(LANGUAGE_MODEL) else n: n
                    for n in names}
        return super().canonical_names(names)
