"""The ``gelu`` FFN: W₂ · GELU(W₁ x + b₁) + b₂ (BERT exact, GPT-2 tanh), checked from its weights."""
from __future__ import annotations

import math

import pytest
import torch

import seqzoo
from seqzoo.recipe import resolve


def gelu_exact(h):
    return 0.5 * h * (1.0 + torch.erf(h / math.sqrt(2.0)))


def gelu_tanh(h):
    return 0.5 * h * (1.0 + torch.tanh(0.7978845608 * (h + 0.044715 * h**3)))


def make(**params):
    return seqzoo.registry().create("ffn", {"kind": "gelu", **params}, 8).double().eval()


@pytest.mark.parametrize("approximate,formula", [("none", gelu_exact), ("tanh", gelu_tanh)])
def test_output_matches_direct_computation(approximate, formula):
    ffn = make(hidden=12, approximate=approximate)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    h = x @ ffn.up.weight.T + ffn.up.bias
    expected = formula(h) @ ffn.down.weight.T + ffn.down.bias
    torch.testing.assert_close(ffn(x), expected, rtol=1e-10, atol=1e-10)


def test_parameter_names_and_default_width_unchanged():
    ffn = make()
    assert ffn.hidden == 32
    assert {k: tuple(v.shape) for k, v in ffn.state_dict().items()} == {
        "up.weight": (32, 8), "up.bias": (32,), "down.weight": (8, 32), "down.bias": (8,)}


def test_bias_false_drops_both_biases():
    ffn = make(bias=False)
    assert ffn.up.bias is None and ffn.down.bias is None


def test_recipe_params_are_unchanged():
    spec = {"kind": "gelu", "hidden": 16, "bias": False, "approximate": "tanh", "dropout": 0.1}
    ffn = seqzoo.registry().create("ffn", spec, 8)
    assert ffn.hidden == 16 and ffn.activation.approximate == "tanh" and ffn.dropout.p == 0.1


def test_dropout_only_while_training():
    ffn = make(dropout=0.5)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    torch.testing.assert_close(ffn(x), ffn(x))
    ffn.train()
    assert not torch.allclose(ffn(x), ffn.eval()(x))


def test_gradcheck_float64():
    ffn = seqzoo.registry().create("ffn", {"kind": "gelu", "hidden": 4}, 3).double()
    x = torch.randn(1, 2, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(ffn, (x,))


def test_gpt2_recipe_ffn_uses_tanh_gelu():
    spec = resolve("gpt2").data["model"]["ffn"]
    with torch.device("meta"):
        ffn = seqzoo.registry().create("ffn", spec, 768)
    assert ffn.hidden == 3072 and ffn.activation.approximate == "tanh"


def test_unknown_approximation_rejected_with_suggestion():
    with pytest.raises(seqzoo.RegistryError,
                       match=r"ffn\.approximate: 'tahn' is not one of 'none', 'tanh'; did you mean 'tanh'\?"):
        seqzoo.registry().create("ffn", {"kind": "gelu", "approximate": "tahn"}, 8)
