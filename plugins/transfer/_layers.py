"""What the transfer rules share: which changed keys sit under a part of the model section, the
layer prefixes of a decoder's state dict, and a component spec's kind."""
from __future__ import annotations

import re


def under(changed: list[str], part: str) -> list[str]:
    """The changed keys that are ``part`` or under it, in the model section or in a layer type or
    override (``attention.window``, ``layer_types.local.attention.window``, ``layer_overrides.3.ffn``)."""
    pattern = re.compile(rf"^(?:layer_types\.[^.]+\.|layer_overrides\.[^.]+\.)?{re.escape(part)}(?:\.|$)")
    return [key for key in changed if pattern.match(key)]


def block(i: int) -> str:
    """The state-dict prefix of decoder layer i."""
    return f"decoder.blocks.{i}."


def kind_of(spec) -> str | None:
    """The kind of a component spec: a bare name, a mapping's ``kind``, or None."""
    return spec if isinstance(spec, str) or spec is None else spec.get("kind")
