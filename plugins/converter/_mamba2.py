"""The Mamba-2 mixer as Hugging Face configs spell it (not a family of its own): its spec from a
config whose options may be named otherwise (Mamba-2's, Bamba's), its config keys, tensor rules
and export checks, shared by ``mamba2`` and ``bamba``."""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from seqzoo.errors import CheckpointError
from seqzoo.io.gguf import Transform
from seqzoo.io.gguf.arch import conv_squeezed, per_head_column
from seqzoo.io.hf import Rule, copy, first_problem, linear
from seqzoo.io.hf.config import HFConfig

#: llama.cpp's Mamba-2 tensors (``mamba2`` and the hybrids' Mamba-2 layers): dt_bias as dt_proj's
#: bias, A and D per head as columns, the conv kernel squeezed (the gated norm, grouped, is each
#: family's: its config names the groups).
GGUF_RENAMES = {r"\.dt_bias$": ".dt_proj.bias"}
GGUF_PER_HEAD = Transform(r"\.(A_log|D)$", per_head_column)
GGUF_CONV = Transform(r"conv1d\.weight$", conv_squeezed)

#: transformers 5 writes ±inf and NaN in config.json as {"__float__": "Infinity"}.
SPECIAL_FLOATS = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}
#: A time_step_limit that changes nothing (softplus is never negative).
NO_LIMIT = (0.0, math.inf)


def time_step_limit(value: Any) -> list[float] | None:
    """seqzoo's ``dt_limit`` for a config's ``time_step_limit``: None for (0, ∞), else [lo, hi]."""
    pair = [SPECIAL_FLOATS.get(v.get("__float__"), v) if isinstance(v, dict) else v
            for v in value] if isinstance(value, list | tuple) else None
    if (pair is None or len(pair) != 2 or any(isinstance(v, bool) or not isinstance(v, int | float) for v in pair)
            or any(math.isnan(v) for v in pair) or pair[0] > pair[1] or pair[1] <= 0):
        raise CheckpointError(f"config.json: time_step_limit {value!r} is not supported; it must be a pair "
                              f"[lo, hi] with lo ≤ hi and hi > 0 ([0.0, Infinity] for none)")
    # Δ is a softplus, never negative: a negative lo clamps as 0 does, and dt_limit takes no less
    return None if (float(pair[0]) <= 0.0 and pair[1] == math.inf) else [max(float(pair[0]), 0.0), float(pair[1])]


#: Mamba2Config's names of the mixer's options, by seqzoo ``mamba2`` parameter (Bamba has its own).
NAMES = {"heads": "num_heads", "head_dim": "head_dim", "state": "state_size", "groups": "n_groups",
         "conv": "conv_kernel", "expand": "expand", "bias": "use_bias", "conv_bias": "use_conv_bias",
         "chunk": "chunk_size"}

#: The Mamba-2 mixer's options under ``mamba_*`` names (Bamba's and Granite 4.0-H's configs), by
#: seqzoo ``mamba2`` parameter.
MAMBA_PREFIXED = {"heads": "mamba_n_heads", "head_dim": "mamba_d_head", "state": "mamba_d_state",
                  "groups": "mamba_n_groups", "conv": "mamba_d_conv", "expand": "mamba_expand",
                  "bias": "mamba_proj_bias", "conv_bias": "mamba_conv_bias", "chunk": "mamba_chunk_size"}


def mixer_spec(c: Mapping, names: Mapping[str, str], dim: int, eps: float, *, free_heads: bool = False) -> dict:
    """The ``mamba2`` mixer spec for config ``c`` (defaults filled in) whose options are called
    ``names``, or a CheckpointError naming the first option seqzoo cannot express. ``free_heads``:
    the family sizes the inner width by heads × head_dim alone (Nemotron-H), so the spec names
    ``heads`` and ``expand`` is not used."""
    get = {key: c[name] for key, name in names.items()}
    heads, head_dim, groups, expand = get["heads"], get["head_dim"], get["groups"], get["expand"]
    reader = HFConfig(c)
    for key in ("heads", "head_dim", "state", "groups", "conv", "expand", "chunk"):
        reader.positive_int(names[key])
    if not free_heads and heads * head_dim != expand * dim:
        raise CheckpointError(f"config.json: {names['heads']} {heads} × {names['head_dim']} {head_dim} = "
                              f"{heads * head_dim} must equal {names['expand']}·hidden_size = {expand * dim}")
    if heads % groups:
        raise CheckpointError(f"config.json: {names['groups']} {groups} is not supported; it must divide "
                              f"{names['heads']} {heads}")
    return {"kind": "mamba2", "state": get["state"], "head_dim": head_dim, "groups": groups, "conv": get["conv"],
            "expand": expand, "bias": get["bias"], "conv_bias": get["conv_bias"], "norm_eps": eps,
            "dt_limit": time_step_limit(c["time_step_limit"]), "chunk": get["chunk"],
            **({"heads": heads} if free_heads else {})}


def mixer_config(spec: Mapping, names: Mapping[str, str], dim: int) -> dict:
    """config.json's mixer options (called ``names``) for a resolved ``mamba2`` spec."""
    heads = spec.get("heads") or spec["expand"] * dim // spec["head_dim"]
    values = {**{key: spec[key] for key in names if key != "heads"}, "heads": heads}
    out = {name: values[key] for key, name in names.items()}
    if spec["dt_limit"] is not None:  # else the configs' default (0, ∞), which JSON cannot spell portably
        out["time_step_limit"] = [float(v) for v in spec["dt_limit"]]
    return out


def mixer_rules(ours: str, theirs: str, spec: Mapping) -> list[Rule]:
    """A ``mamba2`` mixer's tensors (seqzoo prefix ``ours``, HF prefix ``theirs``): same names, same
    shapes (no ``norm.weight`` without ``rmsnorm``)."""
    names = ("A_log", "D", "dt_bias", "norm.weight") if spec.get("rmsnorm", True) else ("A_log", "D", "dt_bias")
    rules = [copy(ours + name, theirs + name) for name in names]
    rules += linear(ours + "in_proj", theirs + "in_proj", spec["bias"])
    rules += linear(ours + "conv1d", theirs + "conv1d", spec["conv_bias"])
    return rules + linear(ours + "out_proj", theirs + "out_proj", spec["bias"])


def mixer_problem(spec: Mapping, eps: float, family: str, *, free_heads: bool = False) -> str | None:
    """Why a resolved ``mamba2`` spec has no HF form (the family has one ε, ``eps``; ``free_heads``
    as for ``mixer_spec``), or None."""
    limit = spec["dt_limit"]
    return first_problem(
        (free_heads or spec.get("heads") is None,
         f"model.mixer.heads is set; {family} sizes its Mamba-2 layers by expand·hidden_size"),
        (spec["norm_eps"] == eps, f"model.mixer.norm_eps {spec['norm_eps']} must equal model.norm.eps {eps} "
                                  f"({family} has one ε)"),
        (limit is None or (len(limit) == 2 and limit[0] <= limit[1]),
         f"model.mixer.dt_limit {limit} must be a pair [lo, hi] with lo ≤ hi"),
        (spec.get("rmsnorm", True) and not spec.get("norm_before_gate", False),
         f"model.mixer: {family}'s Mamba-2 gates, then normalises (rmsnorm true, norm_before_gate false)"),
    )
