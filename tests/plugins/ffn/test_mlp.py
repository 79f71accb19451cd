"""The generic ``mlp`` FFN: W₂ · act(W₁ x + b₁) + b₂ with any activation component."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import seqzoo


def make(**params):
    return seqzoo.registry().create("ffn", {"kind": "mlp", **params}, 8).double().eval()


def test_default_activation_is_exact_gelu():
    ffn = make(hidden=12)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    h = x @ ffn.up.weight.T + ffn.up.bias
    expected = (0.5 * h * (1.0 + torch.erf(h / math.sqrt(2.0)))) @ ffn.down.weight.T + ffn.down.bias
    torch.testing.assert_close(ffn(x), expected, rtol=1e-10, atol=1e-10)


def test_quick_gelu_activation_matches_clip_formula():
    ffn = make(hidden=12, activation="quick_gelu")
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    h = x @ ffn.up.weight.T + ffn.up.bias
    expected = (h * torch.sigmoid(1.702 * h)) @ ffn.down.weight.T + ffn.down.bias
    torch.testing.assert_close(ffn(x), expected, rtol=1e-10, atol=1e-10)


def test_activation_given_as_mapping_passes_its_params():
    ffn = make(activation={"kind": "gelu", "approximate": "tanh"})
    assert ffn.activation.approximate == "tanh"


def test_relu_activation_equals_relu_ffn():
    mlp = make(hidden=12, activation="relu")
    relu = seqzoo.registry().create("ffn", {"kind": "relu", "hidden": 12}, 8).double().eval()
    relu.load_state_dict(mlp.state_dict())
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    torch.testing.assert_close(mlp(x), relu(x), rtol=0, atol=0)


def test_dropout_applies_after_the_activation():
    ffn = make(hidden=12, activation="silu", dropout=0.5).train()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    torch.manual_seed(1)
    out = ffn(x)
    torch.manual_seed(1)
    h = F.dropout(F.silu(ffn.up(x)), p=0.5, training=True)
    torch.testing.assert_close(out, ffn.down(h), rtol=0, atol=0)


def test_gradcheck_float64():
    ffn = seqzoo.registry().create("ffn", {"kind": "mlp", "hidden": 4, "activation": "tanh"}, 3).double()
    x = torch.randn(1, 2, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(ffn, (x,))


def test_builds_from_recipe_and_records_the_activation():
    model = seqzoo.build("tiny-gpt", ["model.ffn={kind: mlp, activation: swish}"], device="cpu").eval()
    assert model.recipe["model"]["ffn"]["activation"] == {"kind": "silu"}
    assert model.components["model.ffn.activation"]["name"] == "silu"
    assert model(torch.randint(0, 259, (1, 4))).shape == (1, 4, 259)


def test_recipe_rejects_unknown_activation_with_suggestion():
    with pytest.raises(seqzoo.RecipeError,
                       match=r"model\.ffn\.activation: unknown activation 'slu'; did you mean 'silu'\?"):
        seqzoo.build("tiny-gpt", ["model.ffn={kind: mlp, activation: slu}"])


def test_create_rejects_unknown_activation_with_suggestion():
    with pytest.raises(seqzoo.RegistryError, match=r"unknown activation 'slu'; did you mean 'silu'\?"):
        seqzoo.registry().create("ffn", {"kind": "mlp", "activation": "slu"}, 8)
