"""Linear scaling / position interpolation (docs/formulas.md §4.1): ω' = ω/s, attention factor 1."""
from __future__ import annotations

import pytest
import torch

import seqzoo
from seqzoo.errors import RegistryError
from seqzoo.plugins.position.rope import Rope, rope_inv_freq


def reference_inv_freq(rotary_dim: int, base: float) -> torch.Tensor:
    return base ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)


def linear(**params):
    return seqzoo.registry().create("rope_scaling", {"kind": "linear", **params})


@pytest.mark.parametrize("factor", [1.0, 2.0, 4.0, 8.5])
def test_frequencies_divided_by_factor(factor):
    inv_freq = rope_inv_freq(128, 1e4)
    scaled, attention_factor = linear(factor=factor).frequencies(
        inv_freq, rotary_dim=128, base=1e4, max_seq_len=4096, positions=torch.arange(10)[None])
    assert scaled.dtype == torch.float64
    assert attention_factor == 1.0
    torch.testing.assert_close(scaled.double(), reference_inv_freq(128, 1e4) / factor, rtol=1e-6, atol=0)


def test_position_interpolation_maps_position_sp_to_p():
    """With s = 4, position 4p rotates exactly as position p did without scaling."""
    plain = Rope(32, 16, 2, 256)
    linear = {"kind": "linear", "factor": 4}
    scaled = Rope(32, 16, 2, 256, scaling=lambda: seqzoo.registry().create("rope_scaling", linear))
    p = torch.tensor([[0, 1, 3, 10, 50]])
    cos_plain, sin_plain = plain.angles(p)
    cos_scaled, sin_scaled = scaled.angles(4 * p)
    torch.testing.assert_close(cos_scaled, cos_plain, atol=1e-5, rtol=0)
    torch.testing.assert_close(sin_scaled, sin_plain, atol=1e-5, rtol=0)


def test_factor_is_required():
    with pytest.raises(RegistryError, match=r"rope_scaling\.factor: missing required key 'factor'"):
        linear()


def test_non_positive_factor_is_rejected():
    with pytest.raises(RegistryError, match=r"rope_scaling\.factor: 0(\.0)? is out of range: must be > 0"):
        linear(factor=0)
