"""Checks of kind ``rope_scaling``: the frequencies it returns, and a decoder that uses it."""
from __future__ import annotations

from collections.abc import Callable

import torch

from ..registry import registry
from ._shared import (
    D,
    causal_model,
    decoder,
    kv_cache_equivalence,
    spec,
)


def checks(name: str, params: dict) -> dict[str, Callable[[], None]]:
    make = lambda: registry().create("rope_scaling", spec(name, params))  # noqa: E731

    def frequencies() -> None:
        inv_freq = 1.0 / 10000 ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
        for length in (8, 64, 200):
            scaled, factor = make().frequencies(inv_freq, rotary_dim=D, base=10000.0, max_seq_len=64,
                                                positions=torch.arange(length)[None])
            if scaled.shape != inv_freq.shape or scaled.dtype != inv_freq.dtype:
                raise AssertionError(f"frequencies gave {tuple(scaled.shape)} {scaled.dtype}, "
                                     f"expected {tuple(inv_freq.shape)} {inv_freq.dtype}")
            if not (torch.isfinite(scaled).all() and (scaled > 0).all() and float(factor) > 0):
                raise AssertionError("frequencies and attention factor must be positive and finite")

    def kv_cache() -> None:
        # Within the model's max_seq_len (64) every rule is fixed, so the cache must agree.
        model = decoder(position={"kind": "rope", "scaling": spec(name, params)})
        causal_model(model)
        kv_cache_equivalence(model)

    return {"frequencies": frequencies, "causality_and_kv_cache": kv_cache}
