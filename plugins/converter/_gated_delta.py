"""Gated DeltaNet as Hugging Face configs spell it (not a family of its own): the ``gated_deltanet``
mixer's spec from the ``linear_*`` keys Qwen3-Next, Qwen3.5 and OLMo-Hybrid share, its config keys,
its tensors in each family's layout, its export checks, and the per-layer kinds the three read alike
from ``layer_types`` (``linear_attention`` or ``full_attention``).

A layer's projections come in three layouts (docs/formulas.md §15.4):
- ``grouped`` (Qwen3-Next): ``in_proj_qkvz`` and ``in_proj_ba``, rows grouped by key head, put in
  seqzoo's [q | k | v | z | b | a] order by ``qwen3_next_layout``;
- ``split`` (Qwen3.5): ``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``, ``in_proj_a``, stacked;
- ``separate`` (OLMo-Hybrid): ``q/k/v/g/b/a_proj`` stacked (g is the output gate z), the conv
  stored as ``q/k/v_conv1d`` and the gated norm and output projection as ``o_norm`` / ``o_proj``.

The three run the short conv through ``hidden_act``, which seqzoo's mixer fixes to SiLU.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from seqzoo.io.hf import Rule, copy, first_problem, fused, kind_of, linear, renamed
from seqzoo.io.hf.config import HFConfig
from seqzoo.plugins.mixer.gated_deltanet import qwen3_next_layout

LINEAR, FULL = "linear_attention", "full_attention"
#: config.json's names of the mixer's shape, by ``gated_deltanet`` parameter.
NAMES = {"heads": "linear_num_key_heads", "head_dim": "linear_key_head_dim",
         "value_heads": "linear_num_value_heads", "value_head_dim": "linear_value_head_dim",
         "conv": "linear_conv_kernel_dim"}
#: A SwiGLU's projections: seqzoo name -> HF name.
GLU = {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}


def layer_kinds(c: HFConfig, default: Callable[[int], list[str]]) -> list[str]:
    """Each layer's kind, ``linear_attention`` or ``full_attention``: ``layer_types``, or the
    family's ``default`` for the layer count when config.json has none."""
    n = c.positive_int("num_hidden_layers")
    kinds = c.get("layer_types")
    kinds = default(n) if kinds is None else kinds
    if not isinstance(kinds, list) or len(kinds) != n or any(k not in (LINEAR, FULL) for k in kinds):
        raise c.refuse("layer_types", f"it must list {n} entries, each {LINEAR} or {FULL}")
    return kinds


def mixer_spec(c: HFConfig, *, norm_eps: float, allow_neg_eigval: bool = False) -> dict:
    """The ``gated_deltanet`` spec of config ``c`` (the family fixes its gated norm's ε)."""
    for key in NAMES.values():
        c.positive_int(key)
    heads, value_heads = c[NAMES["heads"]], c[NAMES["value_heads"]]
    if value_heads % heads:
        raise c.refuse(NAMES["value_heads"], f"it must be a multiple of {NAMES['heads']} {heads} (each key "
                                             f"head serves a whole number of value heads)")
    if c["hidden_act"] != "silu":
        raise c.refuse("hidden_act", "its gated-delta layers run their conv through it, and seqzoo's through "
                                     "silu; it must be silu")
    return {"kind": "gated_deltanet", **{key: c[name] for key, name in NAMES.items()}, "conv_bias": False,
            "gate": True, "allow_neg_eigval": allow_neg_eigval, "norm_eps": norm_eps}


def mixer_shape(spec: Mapping, dim: int) -> tuple[int, int, int, int]:
    """(G, D_k, H, D_v) of a resolved ``gated_deltanet`` spec, its defaults filled in."""
    heads = spec["heads"]
    head_dim = spec["head_dim"] or dim // heads
    return heads, head_dim, spec["value_heads"] or heads, spec["value_head_dim"] or head_dim


def mixer_config(spec: Mapping, dim: int) -> dict:
    """config.json's ``linear_*`` keys for a resolved ``gated_deltanet`` spec."""
    heads, head_dim, value_heads, value_head_dim = mixer_shape(spec, dim)
    shape = {"heads": heads, "head_dim": head_dim, "value_heads": value_heads, "value_head_dim": value_head_dim,
             "conv": spec["conv"]}
    return {name: shape[key] for key, name in NAMES.items()}


def mixer_rules(ours: str, theirs: str, spec: Mapping, dim: int, layout: str) -> list[Rule]:
    """A gated-delta layer's tensors (seqzoo prefix ``ours``, HF prefix ``theirs``) in ``layout``:
    ``grouped``, ``split`` or ``separate``."""
    heads, head_dim, value_heads, value_head_dim = mixer_shape(spec, dim)
    keys, values = heads * head_dim, value_heads * value_head_dim
    rules = [copy(ours + name, theirs + name) for name in ("A_log", "dt_bias")]
    names = {"conv1d": "conv1d", "norm": "norm", "out_proj": "out_proj"}
    if layout == "grouped":
        order = qwen3_next_layout(heads, value_heads, head_dim, value_head_dim)
        inverse, sizes = torch.argsort(order), [2 * keys + 2 * values, 2 * value_heads]
        rules.append(Rule(ours + "in_proj.weight", (theirs + "in_proj_qkvz.weight", theirs + "in_proj_ba.weight"),
                          lambda qkvz, ba: torch.cat([qkvz, ba])[order],
                          lambda w: tuple(w[inverse.to(w.device)].split(sizes))))
    elif layout == "split":
        sources = tuple(f"{theirs}in_proj_{p}.weight" for p in ("qkv", "z", "b", "a"))
        rules.append(fused(ours + "in_proj.weight", sources, (2 * keys + values, values, value_heads, value_heads)))
    else:
        rules.append(fused(ours + "in_proj.weight", tuple(f"{theirs}{p}_proj.weight" for p in "qkvgba"),
                           (keys, keys, values, values, value_heads, value_heads)))
        # Cut at q/k/v as OLMo-core writes it; transformers 5 saves three equal chunks instead.
        rules.append(fused(ours + "conv1d.weight", tuple(f"{theirs}{p}_conv1d.weight" for p in "qkv"),
                           (keys, keys, values), any_cut=True))
        names = {"norm": "o_norm", "out_proj": "o_proj"}
    return rules + renamed(ours, theirs, names, False)


def mixer_problem(spec: Mapping, family: str, *, norm_eps: float, eps_source: str,
                  allow_neg_eigval: bool | None = False) -> str | None:
    """Why a resolved ``gated_deltanet`` spec has no form in ``family``, whose gated norm's ε is
    ``norm_eps`` (``eps_source`` says where it comes from) and whose β is σ(b) or 2σ(b) as
    ``allow_neg_eigval`` says (None: a config key says which), or None."""
    return first_problem(
        (not spec["conv_bias"], f"model.mixer.conv_bias is true; {family}'s short conv has no bias"),
        (spec["gate"], f"model.mixer.gate is false (DeltaNet); {family}'s delta layers decay"),
        (allow_neg_eigval is None or spec["allow_neg_eigval"] == allow_neg_eigval,
         f"model.mixer.allow_neg_eigval must be {allow_neg_eigval} for {family}"),
        (spec["norm_eps"] == norm_eps, f"model.mixer.norm_eps {spec['norm_eps']} must be {norm_eps} ({eps_source})"),
    )


def model_problem(m: Mapping, family: str) -> str | None:
    """Why a model section's embedding and output options have no form in ``family``, or None."""
    return first_problem(
        (m["embed_norm"] is None, f"model.embed_norm is set; {family} has none"),
        (not m["scale_embeddings"], f"model.scale_embeddings is true; {family} has none"),
        (m["final_softcap"] is None, f"model.final_softcap is set; {family} has none"),
        (m["embedding_multiplier"] == 1.0 and m["logits_multiplier"] == 1.0,
         f"model: embedding_multiplier and logits_multiplier must be 1 for {family}"),
    )


def attention_problem(attn, family: str, *, qk_norm: str, scope: str, eps: float, gated: bool) -> str | None:
    """Why a layer's ``AttentionConfig`` is not ``family``'s: GQA with biases on all projections or
    none, a QK-norm of kind ``qk_norm`` over each ``scope`` with the model norm's ``eps``, an
    output gate iff ``gated``, the default score, no window, softcap or sinks."""
    norm = attn.qk_norm
    return first_problem(
        (kind_of(attn.score) == "scaled_dot" and attn.score.get("scale") is None,
         "model.attention.score must be scaled_dot with the default scale"),
        (attn.out_bias in (None, attn.bias), f"model.attention: q/k/v and output biases differ; {family}'s agree"),
        (kind_of(norm) == qk_norm and attn.qk_norm_scope == scope and norm.get("eps") == eps,
         f"model.attention.qk_norm must be {qk_norm} over each {scope} with model.norm's eps"),
        (attn.output_gate == gated, f"model.attention.output_gate must be {str(gated).lower()} for {family}"),
        (attn.window is None, f"model.attention.window: {family} has no sliding window"),
        (attn.softcap is None, f"model.attention.softcap is set; {family} has none"),
        (not attn.sinks, f"model.attention.sinks is set; {family} has none"),
    )


def attention_rules(ours: str, theirs: str, attn, dim: int) -> list[Rule]:
    """An attention layer's q/k/v/o and QK-norm weights (seqzoo prefix ``ours``: the layer's
    ``mixer.``; HF prefix ``theirs``: its ``self_attn.``). With ``output_gate``, the HF query
    projection is twice as wide and holds each head's [q_h | gate_h] in turn (Qwen3-Next): its
    halves become ``qkv_proj``'s q rows and ``gate_proj``."""
    heads, head_dim = attn.heads, attn.head_dim or dim // attn.heads
    q, kv = heads * head_dim, (attn.kv_heads or heads) * head_dim
    rules = []
    for part in ("weight", "bias") if attn.bias else ("weight",):
        sources = tuple(f"{theirs}{x}_proj.{part}" for x in "qkv")
        if not attn.output_gate:
            rules.append(fused(f"{ours}qkv_proj.{part}", sources, (q, kv, kv)))
            continue

        def load(both, k, v):  # rows (H, 2, D) -> q (H·D) and gate (H·D)
            both = both.reshape(heads, 2, head_dim, *both.shape[1:])
            rest = both.shape[3:]
            return torch.cat([both[:, 0].reshape(q, *rest), k, v]), both[:, 1].reshape(q, *rest)

        def save(qkv, gate):
            query, k, v = qkv.split([q, kv, kv])
            rest = gate.shape[1:]
            both = torch.stack([query.reshape(heads, head_dim, *rest), gate.reshape(heads, head_dim, *rest)], 1)
            return both.reshape(2 * q, *rest), k, v

        rules.append(Rule((f"{ours}qkv_proj.{part}", f"{ours}gate_proj.{part}"), sources, load, save))
    if attn.qk_norm is not None:
        rules += renamed(ours, theirs, {"q_norm": "q_norm", "k_norm": "k_norm"}, False)
    out_bias = attn.bias if attn.out_bias is None else attn.out_bias
    return rules + linear(ours + "out_proj", theirs + "o_proj", out_bias)

