"""The ``relu`` FFN (Vaswani 2017): W₂ · max(0, W₁ x + b₁) + b₂, checked from its weights."""
from __future__ import annotations

import torch

import seqzoo


def make(**params):
    return seqzoo.registry().create("ffn", {"kind": "relu", **params}, 8).double().eval()


def test_output_matches_direct_computation():
    ffn = make(hidden=12)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    h = x @ ffn.up.weight.T + ffn.up.bias
    expected = h.clamp(min=0.0) @ ffn.down.weight.T + ffn.down.bias
    torch.testing.assert_close(ffn(x), expected, rtol=1e-10, atol=1e-10)


def test_parameter_names_and_default_width_unchanged():
    ffn = make()
    assert ffn.hidden == 32
    assert {k: tuple(v.shape) for k, v in ffn.state_dict().items()} == {
        "up.weight": (32, 8), "up.bias": (32,), "down.weight": (8, 32), "down.bias": (8,)}


def test_t5_v1_no_bias():
    ffn = make(bias=False)
    assert ffn.up.bias is None and ffn.down.bias is None


def test_gradcheck_float64():
    ffn = seqzoo.registry().create("ffn", {"kind": "relu", "hidden": 4}, 3).double()
    x = (torch.randn(1, 2, 3, dtype=torch.float64)).requires_grad_()
    assert torch.autograd.gradcheck(ffn, (x,))


def test_builds_from_recipe():
    model = seqzoo.build("tiny-gpt", ["model.ffn={kind: relu, hidden: 96}"], device="cpu").eval()
    assert model(torch.randint(0, 259, (2, 7))).shape == (2, 7, 259)
