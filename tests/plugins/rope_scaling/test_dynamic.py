"""Dynamic NTK scaling (docs/formulas.md §4.3): identity up to L, base sized to T = max(pos) + 1 beyond."""
from __future__ import annotations

import pytest
import torch

import seqzoo
from seqzoo.errors import ConfigError
from seqzoo.plugins.position.rope import rope_inv_freq


def reference_inv_freq(rotary_dim: int, base: float) -> torch.Tensor:
    return base ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)


def dynamic(**params):
    return seqzoo.registry().create("rope_scaling", {"kind": "dynamic", **params})


def frequencies(scaling, positions, *, rotary_dim=128, base=1e4, max_seq_len=4096):
    return scaling.frequencies(rope_inv_freq(rotary_dim, base), rotary_dim=rotary_dim, base=base,
                               max_seq_len=max_seq_len, positions=positions)


@pytest.mark.parametrize("length", [1, 100, 2048, 4095, 4096])
def test_identity_up_to_original_length(length):
    scaled, attention_factor = frequencies(dynamic(factor=4.0), torch.arange(length)[None])
    assert attention_factor == 1.0
    assert torch.equal(scaled, rope_inv_freq(128, 1e4))


@pytest.mark.parametrize("factor,length", [(2.0, 4097), (4.0, 6000), (4.0, 16384), (8.0, 40000)])
def test_base_follows_formula_beyond_original_length(factor, length):
    scaled, attention_factor = frequencies(dynamic(factor=factor), torch.arange(length)[None])
    assert attention_factor == 1.0
    new_base = 1e4 * ((factor * length / 4096) - (factor - 1)) ** (128 / 126)
    torch.testing.assert_close(scaled.double(), reference_inv_freq(128, new_base), rtol=1e-5, atol=0)


def test_length_is_the_largest_position_of_any_row():
    positions = torch.tensor([[0, 1, 2], [5000, 5001, 7999]])  # T = 8000
    scaled, _ = frequencies(dynamic(factor=2.0), positions)
    new_base = 1e4 * ((2.0 * 8000 / 4096) - 1.0) ** (128 / 126)
    torch.testing.assert_close(scaled.double(), reference_inv_freq(128, new_base), rtol=1e-5, atol=0)


def test_original_length_defaults_to_model_max_seq_len():
    positions = torch.arange(300)[None]
    default, _ = frequencies(dynamic(factor=2.0), positions, max_seq_len=256)
    explicit, _ = frequencies(dynamic(factor=2.0, original_max_seq_len=256), positions, max_seq_len=999)
    assert torch.equal(default, explicit)
    assert not torch.equal(default, rope_inv_freq(128, 1e4))


def test_rotary_dim_two_raises():
    with pytest.raises(ConfigError, match=r"rope_scaling dynamic: rotary_dim=2 is too small"):
        frequencies(dynamic(factor=2.0), torch.arange(5000)[None], rotary_dim=2)


@torch.no_grad()
def test_cached_decoding_diverges_from_full_forward_beyond_original_length():
    """Documented (HF #25104): within L cached == full; past L the cache holds keys rotated with
    older bases, so token-by-token decoding differs from a full forward pass."""
    model = seqzoo.build("tiny-gpt", [
        "model.position={kind: rope, scaling: {kind: dynamic, factor: 4, original_max_seq_len: 16}}"],
        device="cpu").eval()
    ids = torch.randint(0, 259, (1, 24))
    cache = model.new_cache(1, 24)
    steps = torch.stack([model(ids[:, t:t + 1], cache=cache)[:, -1] for t in range(24)], dim=1)
    within = model(ids[:, :16])  # T = L: unscaled
    torch.testing.assert_close(steps[:, :16], within, atol=1e-5, rtol=1e-5)
    beyond = model(ids)  # T = 24 > L: every position uses the base for T = 24
    # Far beyond the 1e-5 agreement above (logits of this untrained model are ~0.1 in size).
    assert (steps[:, -1] - beyond[:, -1]).abs().max().item() > 1e-4
