"""A patterned model section in one line, for ``seqzoo show``: which layers are which type, and
what each type changes."""
from __future__ import annotations

from typing import Any

import yaml


def describe_layout(model: dict) -> str | None:
    """``layers 0-4 local (window 512, rope 1e4) · 5 global (rope 1e6) ×4`` for a patterned model
    section, None for a uniform one."""
    pattern = model.get("pattern")
    if not pattern:
        return None
    types = model.get("layer_types") or {}
    overrides = model.get("layer_overrides") or {}
    layers = model["layers"]
    names = [pattern[i % len(pattern)] for i in range(layers)]
    notes = [_summary(types.get(n) or {}) for n in names]
    for key, value in overrides.items():
        index = int(key)
        if isinstance(value, str):
            names[index], notes[index] = value, _summary(types.get(value) or {})
        else:
            notes[index] = ", ".join(filter(None, [notes[index], _summary(value)]))
    whole = layers % len(pattern) == 0  # else the last period is cut short (Gemma 3's 26 = 4·6 + 2)
    span = len(pattern) if not overrides and whole else layers
    runs = []
    start = 0
    for i in range(1, span + 1):
        if i == span or (names[i], notes[i]) != (names[start], notes[start]):
            where = str(start) if i - 1 == start else f"{start}-{i - 1}"
            note = notes[start] if notes[start] not in ("", names[start]) else ""
            runs.append(f"{where} {names[start]}" + (f" ({note})" if note else ""))
            start = i
    repeat = f" ×{layers // len(pattern)}" if not overrides and whole and layers > len(pattern) else ""
    return "layers " + " · ".join(runs) + repeat


def _summary(override: dict) -> str:
    """What a layer type changes, in a few words: window 512, rope 1e4, nope, mixer recurrent."""
    words = []
    for key, value in override.items():
        if key == "position":
            kind = value if isinstance(value, str) else value.get("kind")
            if kind == "none":
                words.append("nope")
            elif isinstance(value, dict) and "base" in value:
                words.append(f"{kind or 'rope'} {value['base']:g}")
            else:
                words.append(f"position {kind}")
            continue
        if not isinstance(value, dict):
            words.append(f"{key} {value}")
            continue
        if "kind" in value:
            words.append(f"{key} {value['kind']}")
        words += [f"{k} {_flow(v)}" for k, v in value.items() if k != "kind"]
    return ", ".join(words)


def _flow(value: Any) -> str:
    """A recipe value as a recipe writes it: 512, 1e+06, {kind: swiglu, hidden: 64} (YAML's flow
    style, not a Python dict)."""
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (dict, list)):
        return yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=1 << 16).strip()
    return str(value)
