"""A family's config.json read by type: ``HFConfig`` is the config over the family's defaults
(transformers' config-class defaults), a plain dict to read, with typed readers that refuse a value
seqzoo cannot express in one line naming the key and what it must be.

    c = HFConfig(config, defaults)
    c.positive_int("num_hidden_layers")             # 1, 2, ... (true is no integer)
    c.positive_number("rms_norm_eps")
    c.fraction("partial_rotary_factor")             # in (0, 1]
    c.flag("tie_word_embeddings")
    c.layer_indices("attn_layer_indices", layers)   # a list of 0..layers-1
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...errors import CheckpointError


class HFConfig(dict):
    """config.json's values over ``defaults``; ``where`` names the file in messages."""

    def __init__(self, config: Mapping[str, Any], defaults: Mapping[str, Any] = (), where: str = "config.json"):
        super().__init__({**dict(defaults), **config})
        self.where = where

    def refuse(self, key: str, must: str, value: Any = None) -> CheckpointError:
        """The error for ``key``'s value (or ``value``): ``config.json: KEY VALUE is not supported; MUST``."""
        shown = self.get(key) if value is None else value
        return CheckpointError(f"{self.where}: {key} {shown!r} is not supported; {must}")

    def positive_int(self, key: str, *, why: str = "") -> int:
        """An integer ≥ 1 (``why``: the reason, said instead of the plain rule)."""
        value = self[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self.refuse(key, why or "it must be a positive integer")
        return value

    def positive_number(self, key: str) -> float:
        value = self[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise self.refuse(key, "it must be a positive number")
        return float(value)

    def fraction(self, key: str, value: Any = None) -> float:
        """A number in (0, 1] (``value`` when the family reads it under several names)."""
        value = self[key] if value is None else value
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
            raise self.refuse(key, "it must be a number in (0, 1]", value)
        return float(value)

    def flag(self, key: str) -> bool:
        value = self[key]
        if not isinstance(value, bool):
            raise self.refuse(key, "it must be true or false")
        return value

    def layer_indices(self, key: str, layers: int) -> list[int]:
        """A list of layer indices 0..layers-1 (null reads as none)."""
        value = self[key] or []
        if not isinstance(value, list) or any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < layers
                                              for i in value):
            raise self.refuse(key, f"it must list layer indices 0..{layers - 1}")
        return value
