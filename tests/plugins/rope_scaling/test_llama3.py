"""Llama 3.1 scaling (docs/formulas.md §4.5): keep short wavelengths, divide long ones, blend between."""
from __future__ import annotations

import math

import pytest
import torch

import seqzoo
from seqzoo.errors import ConfigError
from seqzoo.plugins.position.rope import rope_inv_freq


def llama3(**params):
    return seqzoo.registry().create("rope_scaling", {"kind": "llama3", **params})


def reference(rotary_dim: int, base: float, factor: float, low: float, high: float, original: int):
    """docs/formulas.md §4.5 in float64, pair by pair; returns (ω', band) with band 'keep', 'blend' or 'divide'."""
    out, bands = [], []
    for k in range(rotary_dim // 2):
        w = base ** (-2.0 * k / rotary_dim)
        wavelength = 2 * math.pi / w
        if wavelength < original / high:
            out.append(w), bands.append("keep")
        elif wavelength > original / low:
            out.append(w / factor), bands.append("divide")
        else:
            sigma = (original / wavelength - low) / (high - low)
            out.append((1 - sigma) * w / factor + sigma * w), bands.append("blend")
    return torch.tensor(out, dtype=torch.float64), bands


def test_llama31_defaults_split_29_6_29():
    """D = 128, b = 5e5 with the defaults (s 8, low 1, high 4, L 8192): 29 kept, 6 blended, 29 / 8."""
    inv_freq = rope_inv_freq(128, 5e5)
    scaled, attention_factor = llama3().frequencies(
        inv_freq, rotary_dim=128, base=5e5, max_seq_len=131072, positions=torch.arange(4)[None])
    assert attention_factor == 1.0
    assert scaled.dtype == torch.float64
    kept = scaled == inv_freq
    divided = torch.isclose(scaled, inv_freq / 8, rtol=1e-6, atol=0)
    blended = ~kept & ~divided
    assert (kept.sum().item(), blended.sum().item(), divided.sum().item()) == (29, 6, 29)
    assert kept[:29].all() and blended[29:35].all() and divided[35:].all()
    expected, bands = reference(128, 5e5, 8.0, 1.0, 4.0, 8192)
    assert (bands.count("keep"), bands.count("blend"), bands.count("divide")) == (29, 6, 29)
    torch.testing.assert_close(scaled.double(), expected, rtol=1e-5, atol=0)


@pytest.mark.parametrize("params", [
    dict(factor=32.0),  # Llama 3.2
    dict(factor=4.0, low_freq_factor=2.0, high_freq_factor=8.0, original_max_seq_len=64),
])
def test_frequencies_match_reference(params):
    full = dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_seq_len=8192) | params
    scaled, _ = llama3(**params).frequencies(
        rope_inv_freq(64, 1e4), rotary_dim=64, base=1e4, max_seq_len=256, positions=torch.arange(4)[None])
    expected, _ = reference(64, 1e4, full["factor"], full["low_freq_factor"],
                            full["high_freq_factor"], full["original_max_seq_len"])
    torch.testing.assert_close(scaled.double(), expected, rtol=1e-5, atol=0)


def test_defaults_are_llama31():
    scaling = llama3()
    assert (scaling.factor, scaling.low_freq_factor, scaling.high_freq_factor,
            scaling.original_max_seq_len) == (8.0, 1.0, 4.0, 8192)


def test_high_freq_factor_not_above_low_raises():
    with pytest.raises(ConfigError, match=r"rope_scaling llama3: high_freq_factor=1.0 must be greater "
                                          r"than low_freq_factor=4.0.*swap them"):
        llama3(low_freq_factor=4.0, high_freq_factor=1.0)
