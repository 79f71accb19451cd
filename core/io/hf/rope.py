"""How Hugging Face configs spell RoPE, and back: the rules every RoPE family's converter shares
(LLaMA and its kin, Gemma, GPT-NeoX, Phi-3, ModernBERT).

``rope_parameters`` (transformers 5) or the older ``rope_theta`` + ``rope_scaling`` map onto seqzoo's
``rope`` position with a ``rope_scaling`` of kind linear, dynamic, yarn or llama3 (and longrope for
the families that decode it as transformers does, Phi-3); ``partial_rotary_factor`` onto
``rotary_dim``. A rope type or key seqzoo cannot express is a one-line ``CheckpointError``.
"""
from __future__ import annotations

import math

from ...errors import CheckpointError
from .activations import kind_of
from .checks import first_problem

SCALINGS = ("default", "linear", "dynamic", "yarn", "llama3")


# rope_parameters keys a longrope config may hold (transformers' own list, plus the legacy "type").
LONGROPE_KEYS = {"rope_type", "type", "rope_theta", "partial_rotary_factor", "short_factor", "long_factor",
                 "original_max_position_embeddings", "factor", "attention_factor"}


def rope_spec(config: dict, head_dim: int, max_positions: int, *, scalings: tuple[str, ...] = SCALINGS,
              partial: bool = False) -> dict:
    """seqzoo's ``rope`` position spec for a LLaMA-style config (either rope format).
    ``scalings``: the rope_types the family's transformers class reads; ``partial``: it rotates
    only the first int(head_dim · partial_rotary_factor) dims of each head (Phi-3)."""
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if any(isinstance(v, dict) for v in params.values()):
        raise CheckpointError("config.json: rope_parameters per layer type are not supported")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in scalings:
        raise CheckpointError(f"config.json: rope_type {kind!r} is not supported; supported: "
                              f"{', '.join(scalings)}")
    fraction = params.get("partial_rotary_factor", config.get("partial_rotary_factor")) or 1.0
    if fraction != 1.0 and not partial:
        raise CheckpointError(f"config.json: partial_rotary_factor {fraction} is not supported for "
                              f"{config.get('model_type')} (it rotates whole heads)")
    rotary = int(head_dim * fraction)  # as transformers sizes the rotated part
    if rotary != head_dim and (rotary % 2 or not 0 < rotary < head_dim):
        raise CheckpointError(f"config.json: partial_rotary_factor {fraction} rotates {rotary} of "
                              f"head_dim {head_dim} dims; seqzoo rotates an even number, at most head_dim")
    spec: dict = {"kind": "rope", "base": float(params.get("rope_theta", config.get("rope_theta", 10000.0)))}
    if rotary != head_dim:
        spec["rotary_dim"] = rotary
    # HF takes L from a top-level original_max_position_embeddings first (Phi-3 style configs).
    original = (config.get("original_max_position_embeddings")
                or params.get("original_max_position_embeddings") or max_positions)
    factor = params.get("factor")
    if kind == "linear":
        spec["scaling"] = {"kind": "linear", "factor": factor}
    elif kind == "dynamic":  # L is max_position_embeddings, seqzoo's default (the model's max_seq_len)
        spec["scaling"] = {"kind": "dynamic", "factor": factor}
    elif kind == "yarn":
        scaling = {"kind": "yarn", "factor": factor if factor is not None else max_positions / original,
                   "original_max_seq_len": original, "beta_fast": params.get("beta_fast") or 32.0,
                   "beta_slow": params.get("beta_slow") or 1.0, "truncate": params.get("truncate", True)}
        if params.get("attention_factor") is not None:
            scaling["attention_factor"] = params["attention_factor"]
        elif params.get("mscale") and params.get("mscale_all_dim"):  # HF uses them only together
            scaling.update(mscale=params["mscale"], mscale_all_dim=params["mscale_all_dim"])
        spec["scaling"] = scaling
    elif kind == "llama3":
        spec["scaling"] = {"kind": "llama3", "factor": factor, "low_freq_factor": params["low_freq_factor"],
                           "high_freq_factor": params["high_freq_factor"], "original_max_seq_len": original}
    elif kind == "longrope":
        spec["scaling"] = longrope_spec(params, original, rotary)
    return spec


def longrope_spec(params: dict, original: int, rotary_dim: int) -> dict:
    """The ``longrope`` scaling of rope parameters: one short and one long factor per rotary pair."""
    unknown = sorted(set(params) - LONGROPE_KEYS)
    if unknown:
        raise CheckpointError(f"config.json: rope_parameters.{unknown[0]} {params[unknown[0]]!r} is not "
                              f"a longrope option; supported: {', '.join(sorted(LONGROPE_KEYS))}")
    scaling: dict = {"kind": "longrope", "original_max_seq_len": original}
    for key in ("short_factor", "long_factor"):
        factors = params.get(key)
        if not isinstance(factors, list) or len(factors) != rotary_dim // 2:
            raise CheckpointError(f"config.json: rope_parameters.{key} {factors!r} must list one number per "
                                  f"rotary pair ({rotary_dim // 2})")
        scaling[key] = [float(f) for f in factors]
    scaling.update({k: params[k] for k in ("factor", "attention_factor") if params.get(k) is not None})
    return scaling


def rope_parameters(position: dict, max_seq_len: int) -> dict:
    """HF ``rope_parameters`` for a resolved seqzoo ``rope`` spec (``rope_problem`` said yes)."""
    out = {"rope_type": "default", "rope_theta": position["base"]}
    scaling = position["scaling"]
    if scaling is None:
        return out
    kind = scaling["kind"]
    if kind == "longrope":  # no factor unless given: transformers derives it from max_position_embeddings
        out.update(rope_type=kind, short_factor=scaling["short_factor"], long_factor=scaling["long_factor"],
                   original_max_position_embeddings=scaling["original_max_seq_len"])
        return out | {k: scaling[k] for k in ("factor", "attention_factor") if scaling[k] is not None}
    out.update(rope_type=kind, factor=scaling["factor"])
    if kind == "yarn":
        out.update(original_max_position_embeddings=scaling["original_max_seq_len"] or max_seq_len,
                   beta_fast=scaling["beta_fast"], beta_slow=scaling["beta_slow"],
                   truncate=scaling["truncate"])
        if scaling["attention_factor"] is not None:
            out["attention_factor"] = scaling["attention_factor"]
        if scaling["mscale"] is not None:
            out.update(mscale=scaling["mscale"], mscale_all_dim=scaling["mscale_all_dim"])
    elif kind == "llama3":
        out.update(low_freq_factor=scaling["low_freq_factor"], high_freq_factor=scaling["high_freq_factor"],
                   original_max_position_embeddings=scaling["original_max_seq_len"])
    return out


def rope_config(position: dict, max_seq_len: int) -> dict:
    """config.json's rope keys: transformers 5's ``rope_parameters``, and the same values in the
    older ``rope_theta`` + ``rope_scaling`` form that transformers 4 reads (5 reads both alike)."""
    params = rope_parameters(position, max_seq_len)
    scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    return {"rope_parameters": params, "rope_theta": params["rope_theta"],
            "rope_scaling": scaling if scaling["rope_type"] != "default" else None}


def rope_problem(position: dict, max_seq_len: int, head_dim: int, *, scalings: tuple[str, ...] = SCALINGS,
                 partial: bool = False) -> str | None:
    """Why a resolved ``rope`` spec has no HF form (``scalings`` and ``partial`` as in ``rope_spec``)."""
    scaling = position.get("scaling")
    rotary = position.get("rotary_dim") or head_dim
    return first_problem(
        (not position.get("interleaved"), "model.position: interleaved rope (HF LLaMA rotates halves)"),
        (rotary == head_dim or partial, "model.position.rotary_dim: partial rotary"),
        (int(head_dim * (rotary / head_dim)) == rotary,  # HF rounds head_dim · factor down
         f"model.position.rotary_dim {rotary} of head_dim {head_dim} has no exact partial_rotary_factor"),
        (scaling is None or scaling["kind"] in scalings,
         f"model.position.scaling {kind_of(scaling)} has no HF rope_type (supported: {', '.join(scalings[1:])})"),
        (kind_of(scaling) != "dynamic" or scaling["original_max_seq_len"] in (None, max_seq_len),
         "model.position.scaling.original_max_seq_len must equal max_seq_len for HF dynamic"),
    )


def partial_factor(rotary: int, head_dim: int) -> float:
    """The float f with int(head_dim · f) == rotary: r/h, nudged up if rounding lands just below."""
    factor = rotary / head_dim
    while int(head_dim * factor) < rotary:
        factor = math.nextafter(factor, 2.0)
    return factor
