"""Kimi Delta Attention as Hugging Face checkpoints spell it (not a family of its own; Kimi
Linear's layers, docs/formulas.md §15.5): the ``kda`` mixer's spec from a config, its config keys,
its tensors as Moonshot's checkpoints store them (and transformers writes them back) and its export
checks.

The checkpoint keeps the projections apart — ``q/k/v_proj``, ``f_a_proj``, ``b_proj``, ``g_a_proj``,
stacked into seqzoo's ``in_proj`` in that order — and the short conv per stream, ``q/k/v_conv1d``,
concatenated into one ``conv1d``; ``A_log`` is (1, 1, H, 1) there. H, D and K are
``linear_attn_config``'s ``num_heads``, ``head_dim`` and ``short_conv_kernel_size`` (transformers
also writes them as ``linear_num_heads`` / ``linear_head_dim`` / ``linear_conv_kernel_dim``); the low
rank is D, the gated norm's ε the model's.
"""
from __future__ import annotations

from collections.abc import Mapping

from seqzoo.io.hf import Rule, copy, first_problem, fused, renamed

#: linear_attn_config's names, and the top-level keys transformers writes for them.
LINEAR_KEYS = {"num_heads": "linear_num_heads", "head_dim": "linear_head_dim",
               "short_conv_kernel_size": "linear_conv_kernel_dim"}


def mixer_spec(c: Mapping, eps: float) -> dict:
    """The ``kda`` spec of a config whose ``linear_*`` keys are read (see ``LINEAR_KEYS``)."""
    return {"kind": "kda", "heads": c["linear_num_heads"], "head_dim": c["linear_head_dim"],
            "conv": c["linear_conv_kernel_dim"], "norm_eps": eps}


def mixer_config(spec: Mapping, dim: int) -> dict:
    """``linear_attn_config``'s shape keys for a resolved ``kda`` spec."""
    return {"num_heads": spec["heads"], "head_dim": spec["head_dim"] or dim // spec["heads"],
            "short_conv_kernel_size": spec["conv"]}


def mixer_rules(ours: str, theirs: str, spec: Mapping, dim: int) -> list[Rule]:
    """A KDA layer's tensors (seqzoo prefix ``ours``: its ``mixer.``; HF prefix ``theirs``: its
    ``self_attn.``) in a model ``dim`` wide."""
    head_dim = spec["head_dim"] or dim // spec["heads"]
    inner, rank = spec["heads"] * head_dim, spec["rank"] or head_dim
    return [fused(ours + "in_proj.weight", tuple(f"{theirs}{x}.weight" for x in (
                "q_proj", "k_proj", "v_proj", "f_a_proj", "b_proj", "g_a_proj")),
                  (inner, inner, inner, rank, spec["heads"], rank)),
            fused(ours + "conv1d.weight", tuple(f"{theirs}{x}_conv1d.weight" for x in "qkv"), (inner,) * 3),
            Rule(ours + "A_log", (theirs + "A_log",), lambda t: t.flatten(), lambda t: (t.view(1, 1, -1, 1),)),
            copy(ours + "dt_bias", theirs + "dt_bias"),
            *renamed(ours, theirs, {"f_b_proj": "f_b_proj", "g_b_proj": "g_b_proj", "norm": "o_norm",
                                    "out_proj": "o_proj"}, False)]


def mixer_problem(spec: Mapping, dim: int, eps: float, family: str) -> str | None:
    """Why a resolved ``kda`` spec (in a model ``dim`` wide) has no form in ``family``, whose gated
    norm's ε is ``eps``, or None."""
    head_dim = spec["head_dim"] or dim // spec["heads"]
    return first_problem(
        (not spec["conv_bias"] and not spec["gate_bias"] and not spec["allow_neg_eigval"],
         f"model.mixer: {family}'s KDA has no conv or gate bias and β = σ(b) (allow_neg_eigval false)"),
        (spec["rank"] in (None, head_dim), f"model.mixer.rank must equal head_dim ({family}'s)"),
        (spec["norm_eps"] == eps, f"model.mixer.norm_eps {spec['norm_eps']} must be model.norm.eps {eps}"),
    )
