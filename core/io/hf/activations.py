"""Activations: Hugging Face ``hidden_act`` names <-> seqzoo FFN and activation specs."""
from __future__ import annotations

from typing import Any

from ...errors import CheckpointError

# HF ``ACT2FN`` names of the activations seqzoo has, as (seqzoo activation, GELU approximation).
# gelu_new, gelu_fast and gelu_pytorch_tanh are the same function, 0.5x(1 + tanh(√(2/π)(x + 0.044715x³))).
ACTIVATIONS: dict[str, tuple[str, str | None]] = {
    "gelu": ("gelu", "none"), "gelu_python": ("gelu", "none"), "gelu_new": ("gelu", "tanh"),
    "gelu_fast": ("gelu", "tanh"), "gelu_pytorch_tanh": ("gelu", "tanh"), "relu": ("relu", None),
    "silu": ("silu", None), "swish": ("silu", None), "quick_gelu": ("quick_gelu", None),
    "tanh": ("tanh", None), "sigmoid": ("sigmoid", None), "relu2": ("relu2", None),
}


def _activation(name: Any, where: str) -> tuple[str, str | None]:
    if name not in ACTIVATIONS:
        raise CheckpointError(f"{where}: activation {name!r} has no seqzoo equivalent; supported: "
                              f"{', '.join(sorted(ACTIVATIONS))}")
    return ACTIVATIONS[name]


def mlp_ffn(act: Any, hidden: int, bias: bool, where: str = "config.json") -> dict:
    """The ungated FFN spec for HF activation ``act``: W₂ act(W₁x + b₁) + b₂."""
    kind, approximate = _activation(act, where)
    if kind == "gelu":
        return {"kind": "gelu", "hidden": hidden, "bias": bias, "approximate": approximate}
    if kind == "relu":
        return {"kind": "relu", "hidden": hidden, "bias": bias}
    return {"kind": "mlp", "hidden": hidden, "bias": bias, "activation": kind}


def glu_ffn(act: Any, hidden: int, bias: bool, where: str = "config.json") -> dict:
    """The gated FFN spec for HF activation ``act`` on the gate: W₂ (act(W₁x) ⊙ W₃x)."""
    kind, approximate = _activation(act, where)
    if kind == "silu":
        return {"kind": "swiglu", "hidden": hidden, "bias": bias}
    if kind == "gelu":
        return {"kind": "geglu", "hidden": hidden, "bias": bias, "approximate": approximate}
    return {"kind": "glu", "hidden": hidden, "bias": bias, "activation": kind}


def ffn_activation(ffn: dict | None, tanh_name: str = "gelu_new") -> tuple[str, bool] | None:
    """(HF activation name, gated?) of a resolved ffn spec, or None when HF has no name for it (or
    there is no FFN: ``ffn: null``). ``tanh_name`` is the family's name for tanh-GELU (gelu_new in
    GPT-2/BERT, gelu_pytorch_tanh in LLaMA)."""
    if ffn is None:
        return None
    kind = ffn["kind"]
    gated = kind in ("swiglu", "geglu", "glu")
    if kind in ("gelu", "geglu"):
        return (tanh_name if ffn["approximate"] == "tanh" else "gelu"), gated
    if kind == "swiglu":
        return "silu", True
    if kind == "relu":
        return "relu", False
    if kind in ("mlp", "glu"):
        spec = ffn["activation"]
        name = kind_of(spec)
        if name == "gelu":
            tanh = isinstance(spec, dict) and spec.get("approximate") == "tanh"
            return (tanh_name if tanh else "gelu"), gated
        if name == "gelu_tanh":
            return tanh_name, gated
        return (name, gated) if name in ACTIVATIONS else None
    return None


def activation_spec(name: Any) -> str | dict:
    """seqzoo's ``activation`` spec for a Hugging Face activation name (``hidden_act``)."""
    ffn = mlp_ffn(name, 1, True)
    if ffn["kind"] == "gelu":
        return {"kind": "gelu", "approximate": ffn["approximate"]}
    return ffn["kind"] if ffn["kind"] == "relu" else ffn["activation"]


def activation_name(spec: Any, tanh_name: str = "gelu_new") -> str | None:
    """The Hugging Face name of a resolved ``activation`` spec, or None when it has none."""
    found = ffn_activation({"kind": "mlp", "activation": spec}, tanh_name)
    return found[0] if found else None


def kind_of(spec: Any) -> str | None:
    """The component name of a spec: ``"rope"`` for ``"rope"`` or ``{kind: rope, ...}``."""
    return spec if isinstance(spec, str) else spec.get("kind") if isinstance(spec, dict) else None
