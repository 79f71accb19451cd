"""YaRN (docs/formulas.md §4.4): correction range, ramp over pair index, blend, attention factor."""
from __future__ import annotations

import math

import pytest
import torch

import seqzoo
from seqzoo.errors import ConfigError, RecipeError
from seqzoo.plugins.position.rope import Rope, rope_inv_freq
from seqzoo.plugins.rope_scaling.yarn import find_correction_range


def yarn(**params):
    return seqzoo.registry().create("rope_scaling", {"kind": "yarn", **params})


def frequencies(scaling, *, rotary_dim=128, base=1e4, max_seq_len=16384):
    return scaling.frequencies(rope_inv_freq(rotary_dim, base), rotary_dim=rotary_dim, base=base,
                               max_seq_len=max_seq_len, positions=torch.arange(4)[None])


def fcd(rotations: float, rotary_dim: int = 128, base: float = 1e4, original: int = 4096) -> float:
    """Solve L / λ_k = rotations for k, λ_k = 2π·b^(2k/d_r) (written out independently)."""
    return math.log(original / (2 * math.pi * rotations)) / math.log(base) * rotary_dim / 2


def test_correction_range_matches_llama2_worked_example():
    """d_r = 128, b = 1e4, L = 4096: fcd(32) = 20.94 -> low 20, fcd(1) = 45.03 -> high 46."""
    assert fcd(32) == pytest.approx(20.94, abs=5e-3)
    assert fcd(1) == pytest.approx(45.03, abs=5e-3)
    assert find_correction_range(32, 1, 128, 1e4, 4096, True) == (20, 46)


@pytest.mark.parametrize("factor", [2.0, 4.0, 16.0])
def test_frequencies_kept_below_low_interpolated_above_high(factor):
    inv_freq = rope_inv_freq(128, 1e4)
    scaled, _ = frequencies(yarn(factor=factor, original_max_seq_len=4096))
    assert scaled.dtype == torch.float64
    torch.testing.assert_close(scaled[:21], inv_freq[:21], rtol=1e-6, atol=0)  # k <= 20
    torch.testing.assert_close(scaled[46:], inv_freq[46:] / factor, rtol=1e-6, atol=0)  # k >= 46
    # In between, linear in k from low = 20 to high = 46.
    k = torch.arange(21, 46, dtype=torch.float64)
    ramp = (k - 20) / (46 - 20)
    w = 1e4 ** (-2 * k / 128)
    expected = (w / factor) * ramp + w * (1 - ramp)
    torch.testing.assert_close(scaled[21:46].double(), expected, rtol=1e-5, atol=0)


def test_original_length_defaults_to_model_max_seq_len():
    default, _ = frequencies(yarn(factor=4.0), max_seq_len=4096)
    explicit, _ = frequencies(yarn(factor=4.0, original_max_seq_len=4096), max_seq_len=99999)
    assert torch.equal(default, explicit)


def test_truncate_false_ramps_between_fractional_ends():
    """gpt-oss style: no floor/ceil, the ramp runs from fcd(32) = 20.94 to fcd(1) = 45.03."""
    scaled, _ = frequencies(yarn(factor=4.0, original_max_seq_len=4096, truncate=False))
    low, high = fcd(32), fcd(1)
    k = torch.arange(64, dtype=torch.float64)
    ramp = ((k - low) / (high - low)).clamp(0, 1)
    w = 1e4 ** (-2 * k / 128)
    torch.testing.assert_close(scaled.double(), (w / 4) * ramp + w * (1 - ramp), rtol=1e-5, atol=0)


def test_equal_ends_are_separated_instead_of_dividing_by_zero():
    """L = 4 < 2π: every fcd is negative, so low = high = 0; high becomes 0.001, so pair 0 keeps ω
    and every other pair is fully interpolated (no NaN)."""
    scaled, _ = frequencies(yarn(factor=4.0, original_max_seq_len=4), rotary_dim=16)
    inv_freq = rope_inv_freq(16, 1e4)
    assert not scaled.isnan().any()
    assert scaled[0] == inv_freq[0]
    torch.testing.assert_close(scaled[1:], inv_freq[1:] / 4, rtol=1e-6, atol=0)


def test_high_is_clamped_to_rotary_dim_minus_one():
    """A long L puts fcd(1) past d_r − 1; the clamp keeps d_r − 1 (not d_r/2 − 1), as the reference."""
    low, high = find_correction_range(32, 1, 16, 100.0, 10**6, True)
    assert fcd(1, 16, 100.0, 10**6) > 16
    assert high == 15 and low == math.floor(fcd(32, 16, 100.0, 10**6))


# mscale = 0.1·ln(s) + 1, worked values of docs/formulas.md §4.4 (4 decimals).
@pytest.mark.parametrize("factor,mscale", [(2, 1.0693), (4, 1.1386), (8, 1.2079), (16, 1.2773),
                                           (32, 1.3466), (40, 1.3689)])
def test_default_attention_factor_matches_worked_values(factor, mscale):
    _, attention_factor = frequencies(yarn(factor=factor))
    assert attention_factor == pytest.approx(mscale, abs=5e-5)


@pytest.mark.parametrize("factor", [0.5, 1.0])
def test_attention_factor_is_one_without_extension(factor):
    assert frequencies(yarn(factor=factor))[1] == 1.0


def test_explicit_attention_factor_wins():
    assert frequencies(yarn(factor=4.0, attention_factor=1.5))[1] == 1.5


def test_deepseek_v3_mscale_gives_unit_amplitude_and_softmax_scale():
    """mscale = mscale_all_dim = 1, s = 40: cos/sin factor exactly 1, softmax scale × 1.8739."""
    scaling = yarn(factor=40.0, mscale=1.0, mscale_all_dim=1.0)
    assert frequencies(scaling)[1] == 1.0
    assert scaling.softmax_scale_factor == pytest.approx(1.8739, abs=5e-5)


def test_deepseek_v2_mscale():
    """DeepSeek-V2: both 0.707, s = 40: amplitude 1, softmax scale × (0.1·0.707·ln 40 + 1)² ≈ 1.59."""
    scaling = yarn(factor=40.0, mscale=0.707, mscale_all_dim=0.707)
    assert frequencies(scaling)[1] == 1.0
    assert scaling.softmax_scale_factor == pytest.approx((0.0707 * math.log(40) + 1) ** 2, rel=1e-12)
    assert scaling.softmax_scale_factor == pytest.approx(1.59, abs=5e-3)


def test_mscale_ratio_when_they_differ():
    scaling = yarn(factor=16.0, mscale=1.0, mscale_all_dim=0.5)
    expected = (0.1 * math.log(16) + 1) / (0.05 * math.log(16) + 1)
    assert frequencies(scaling)[1] == pytest.approx(expected, rel=1e-12)
    assert yarn(factor=16.0).softmax_scale_factor == 1.0


@pytest.mark.parametrize("attention_factor", [None, 2.5])
def test_attention_factor_scales_logits_by_its_square(attention_factor):
    """The amplitude multiplies both cos and sin, so q·k through a Rope scales by factor²."""
    spec = {"kind": "yarn", "factor": 4.0, "original_max_seq_len": 64}
    def scaling(factor: float):  # a factory of the rule, as the registry hands one to Rope
        return lambda: seqzoo.registry().create("rope_scaling", {**spec, "attention_factor": factor})

    scaled = Rope(64, 16, 4, 256, scaling=scaling(attention_factor))
    unit = Rope(64, 16, 4, 256, scaling=scaling(1.0))
    q, k = torch.randn(1, 4, 6, 16), torch.randn(1, 4, 6, 16)
    pos = torch.arange(6)[None] * 11
    logits = (lambda a, b: a @ b.transpose(-2, -1))(*scaled.rotate(q, k, pos, pos))
    reference = (lambda a, b: a @ b.transpose(-2, -1))(*unit.rotate(q, k, pos, pos))
    factor = 0.1 * math.log(4.0) + 1 if attention_factor is None else attention_factor
    torch.testing.assert_close(logits, reference * factor ** 2, atol=1e-4, rtol=1e-5)


def test_beta_fast_not_above_beta_slow_raises():
    with pytest.raises(ConfigError, match=r"rope_scaling yarn: beta_fast=1.0 must be greater than "
                                          r"beta_slow=32.0.*swap them"):
        yarn(factor=4.0, beta_fast=1.0, beta_slow=32.0)


def test_beta_error_in_recipe_is_a_recipe_error():
    with pytest.raises(RecipeError, match=r"beta_fast=2.0 must be greater than beta_slow=2.0"):
        seqzoo.build("tiny-gpt", ["model.position={kind: rope, scaling: "
                                  "{kind: yarn, factor: 4, beta_fast: 2, beta_slow: 2}}"], device="cpu")


@pytest.mark.parametrize("given,missing", [("mscale", "mscale_all_dim"), ("mscale_all_dim", "mscale")])
def test_mscale_without_its_partner_raises(given, missing):
    with pytest.raises(ConfigError, match=rf"rope_scaling yarn: {given}=0.7 is set without {missing}"):
        yarn(factor=4.0, **{given: 0.7})


def test_attention_factor_with_mscale_raises():
    with pytest.raises(ConfigError, match=r"attention_factor=1.2 and mscale=1.0 both set.*keep one"):
        yarn(factor=4.0, attention_factor=1.2, mscale=1.0, mscale_all_dim=1.0)
