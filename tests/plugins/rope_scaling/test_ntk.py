"""Static NTK-aware scaling (docs/formulas.md §4.2): b' = b·s^(d_r/(d_r−2)), ω' recomputed from b'."""
from __future__ import annotations

import pytest
import torch

import seqzoo
from seqzoo.errors import ConfigError
from seqzoo.plugins.position.rope import rope_inv_freq


def reference_inv_freq(rotary_dim: int, base: float) -> torch.Tensor:
    return base ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)


def ntk_frequencies(factor: float, rotary_dim: int = 128, base: float = 1e4):
    scaling = seqzoo.registry().create("rope_scaling", {"kind": "ntk", "factor": factor})
    return scaling.frequencies(rope_inv_freq(rotary_dim, base), rotary_dim=rotary_dim, base=base,
                               max_seq_len=4096, positions=torch.arange(4)[None])


# Worked example of docs/formulas.md §4.2 (d_r = 128, b = 1e4), b' to five significant digits.
@pytest.mark.parametrize("factor,new_base", [(2, 20221), (4, 40890), (8, 82685)])
def test_base_matches_worked_example(factor, new_base):
    scaled, attention_factor = ntk_frequencies(factor)
    assert attention_factor == 1.0
    assert scaled.dtype == torch.float64
    # b' is quoted to ~1e-5 relative; ω_k = b'^(−2k/d_r) inherits at most that.
    torch.testing.assert_close(scaled.double(), reference_inv_freq(128, new_base), rtol=3e-5, atol=0)


@pytest.mark.parametrize("factor", [2.0, 4.0, 8.0])
def test_lowest_frequency_divided_by_factor_highest_unchanged(factor):
    scaled, _ = ntk_frequencies(factor)
    original = reference_inv_freq(128, 1e4)
    assert scaled[0].item() == 1.0
    torch.testing.assert_close(scaled[-1].double(), original[-1] / factor, rtol=1e-5, atol=0)


def test_factor_one_is_identity():
    scaled, _ = ntk_frequencies(1.0)
    assert torch.equal(scaled, rope_inv_freq(128, 1e4))


def test_rotary_dim_two_raises():
    with pytest.raises(ConfigError, match=r"rope_scaling ntk: rotary_dim=2 is too small.*rotary_dim >= 4"):
        ntk_frequencies(2.0, rotary_dim=2)
