"""The ``swiglu`` FFN (Shazeer 2020; LLaMA): down(SiLU(gate x) ⊙ up x), HF LLaMA weight roles, and
LLaMA's hidden-size rule (docs/formulas.md §11)."""
from __future__ import annotations

import pytest
import torch

import seqzoo
from seqzoo.errors import ConfigError


def make(dim: int = 8, **params):
    return seqzoo.registry().create("ffn", {"kind": "swiglu", **params}, dim)


def silu(h):
    return h * torch.sigmoid(h)


def test_output_matches_direct_computation():
    ffn = make(hidden=12).double()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    gate, up, down = ffn.gate.weight, ffn.up.weight, ffn.down.weight
    expected = (silu(x @ gate.T) * (x @ up.T)) @ down.T
    torch.testing.assert_close(ffn(x), expected, rtol=1e-10, atol=1e-10)


def test_silu_is_on_the_gate_branch_not_up():
    # gate pre-activations are -20, where SiLU ≈ 0; up's are 1. Right: ≈ 0. Swapped: SiLU(1)·(-20).
    ffn = make(dim=4, hidden=4)
    with torch.no_grad():
        ffn.gate.weight.copy_(-20.0 * torch.eye(4))
        ffn.up.weight.copy_(torch.eye(4))
        ffn.down.weight.copy_(torch.eye(4))
    out = ffn(torch.ones(1, 1, 4))
    assert out.abs().max().item() < 1e-6


def test_hf_llama_weight_names_and_no_bias_by_default():
    ffn = make(hidden=12)
    assert {k: tuple(v.shape) for k, v in ffn.state_dict().items()} == {
        "gate.weight": (12, 8), "up.weight": (12, 8), "down.weight": (8, 12)}


def test_bias_true_adds_biases_to_all_three():
    ffn = make(hidden=12, bias=True).double()
    x = torch.randn(3, 8, dtype=torch.float64)
    expected = (silu(ffn.gate(x)) * ffn.up(x)) @ ffn.down.weight.T + ffn.down.bias
    assert ffn.gate.bias is not None and ffn.up.bias is not None
    torch.testing.assert_close(ffn(x), expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dim,params,hidden", [
    (4096, {"multiple_of": 256}, 11008),                              # LLaMA-7B
    (5120, {"multiple_of": 256}, 13824),                              # LLaMA-13B
    (4096, {"multiple_of": 1024, "ffn_dim_multiplier": 1.3}, 14336),  # LLaMA-3-8B
    (8192, {"multiple_of": 4096, "ffn_dim_multiplier": 1.3}, 28672),  # LLaMA-3-70B
])
def test_hidden_rule_reproduces_llama(dim, params, hidden):
    with torch.device("meta"):  # shapes only, nothing allocated
        ffn = make(dim, **params)
    assert ffn.hidden == hidden
    assert ffn.gate.weight.is_meta and ffn.gate.weight.shape == (hidden, dim)
    assert ffn.down.weight.shape == (dim, hidden)


def test_hidden_rule_without_rounding_is_two_thirds_of_4c():
    assert make(64).hidden == 170  # int(2·256/3)


def test_explicit_hidden_is_used_as_is():
    assert make(64, hidden=96).hidden == 96
    assert make(64, hidden=512, multiple_of=256).hidden == 512


def test_hidden_with_multiplier_is_rejected():
    with pytest.raises(ConfigError, match=r"^swiglu: ffn_dim_multiplier=1\.3 only scales the derived "
                                          r"width, but hidden=96 is set; drop one of them"):
        make(64, hidden=96, ffn_dim_multiplier=1.3)


def test_hidden_not_a_multiple_is_rejected_with_fix():
    with pytest.raises(ConfigError, match=r"^swiglu: hidden=100 must be a multiple of multiple_of=64; "
                                          r"use hidden=128, or hidden: null to derive it"):
        make(64, hidden=100, multiple_of=64)


def test_recipe_reports_hidden_conflict_as_recipe_error():
    with pytest.raises(seqzoo.RecipeError,
                       match=r"model\.ffn: swiglu: hidden=100 must be a multiple of multiple_of=64"):
        seqzoo.build("tiny-gpt", ["model.ffn={kind: swiglu, hidden: 100, multiple_of: 64}"], device="meta")


def test_recipe_rejects_non_positive_multiple_of():
    with pytest.raises(seqzoo.RecipeError, match=r"model\.ffn\.multiple_of: 0 is out of range: must be >= 1"):
        seqzoo.build("tiny-gpt", ["model.ffn={kind: swiglu, multiple_of: 0}"])


def test_gradcheck_float64():
    ffn = make(3, hidden=4).double()
    x = torch.randn(1, 2, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(ffn, (x,))


def test_builds_from_recipe_with_down_as_residual_projection():
    model = seqzoo.build("tiny-gpt", ["model.ffn={kind: swiglu, hidden: 96}"], device="cpu").eval()
    assert model(torch.randint(0, 259, (2, 7))).shape == (2, 7, 259)
    ffn = model.decoder.blocks[0].ffn
    assert ffn.hidden == 96
    # init_weights scales modules named "...down" by 1/√(2·layers) = 1/√8 (GPT-2 residual init)
    ratio = ffn.down.weight.std().item() / ffn.gate.weight.std().item()
    assert ratio == pytest.approx(8 ** -0.5, rel=0.1)
