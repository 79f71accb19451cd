"""The generic ``glu`` FFN (Shazeer 2020): down(act(gate x) ⊙ up x), act any activation component
(default sigmoid: the paper's FFN_GLU)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import seqzoo


def make(dim: int = 8, **params):
    return seqzoo.registry().create("ffn", {"kind": "glu", **params}, dim)


def test_default_is_sigmoid_glu():
    ffn = make(hidden=12).double()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    gate = 1.0 / (1.0 + torch.exp(-(x @ ffn.gate.weight.T)))
    expected = (gate * (x @ ffn.up.weight.T)) @ ffn.down.weight.T
    torch.testing.assert_close(ffn(x), expected, rtol=1e-10, atol=1e-10)


def test_relu_activation_is_reglu():
    ffn = make(hidden=12, activation="relu").double()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    expected = ((x @ ffn.gate.weight.T).clamp(min=0.0) * (x @ ffn.up.weight.T)) @ ffn.down.weight.T
    torch.testing.assert_close(ffn(x), expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("activation,named", [
    ("silu", {"kind": "swiglu"}),
    ({"kind": "gelu", "approximate": "tanh"}, {"kind": "geglu", "approximate": "tanh"}),
])
def test_named_variants_equal_glu_with_their_activation(activation, named):
    glu = make(hidden=12, activation=activation)
    other = seqzoo.registry().create("ffn", {**named, "hidden": 12}, 8)
    other.load_state_dict(glu.state_dict())
    x = torch.randn(2, 5, 8)
    torch.testing.assert_close(glu(x), other(x), rtol=0, atol=0)


def test_dropout_applies_to_the_gated_product():
    ffn = make(hidden=12, activation="silu", dropout=0.5).double().train()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    torch.manual_seed(1)
    out = ffn(x)
    torch.manual_seed(1)
    h = F.dropout(F.silu(ffn.gate(x)) * ffn.up(x), p=0.5, training=True)
    torch.testing.assert_close(out, ffn.down(h), rtol=0, atol=0)


def test_hidden_with_multiplier_is_rejected_naming_glu():
    with pytest.raises(seqzoo.ConfigError, match=r"^glu: ffn_dim_multiplier=2\.0 only scales the derived"):
        make(hidden=16, ffn_dim_multiplier=2.0)


def test_multiplier_scales_before_rounding():
    assert make(64, ffn_dim_multiplier=1.5).hidden == 255              # int(1.5·170)
    assert make(64, ffn_dim_multiplier=1.5, multiple_of=32).hidden == 256


def test_gradcheck_float64():
    ffn = make(3, hidden=4).double()
    x = torch.randn(1, 2, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(ffn, (x,))


def test_builds_from_recipe_with_activation_mapping():
    override = "model.ffn={kind: glu, hidden: 64, activation: {kind: gelu, approximate: tanh}}"
    model = seqzoo.build("tiny-gpt", [override], device="cpu").eval()
    assert model.decoder.blocks[0].ffn.activation.approximate == "tanh"
    assert model(torch.randint(0, 259, (1, 5))).shape == (1, 5, 259)


def test_recipe_rejects_unknown_activation_with_suggestion():
    with pytest.raises(seqzoo.RecipeError,
                       match=r"model\.ffn\.activation: unknown activation 'sigmod'; did you mean 'sigmoid'\?"):
        seqzoo.build("tiny-gpt", ["model.ffn={kind: glu, activation: sigmod}"])
