"""Activation components against torch.nn.functional and the formulas of docs/formulas.md §11."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import seqzoo

SQRT_2_OVER_PI = 0.7978845608  # √(2/π), as written in GPT-2's and BERT's gelu_new


def gelu_exact(x):
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(SQRT_2_OVER_PI * (x + 0.044715 * x**3)))


# name or spec -> reference computed independently of the plugin
REFERENCES = {
    "relu": lambda x: torch.where(x > 0, x, torch.zeros_like(x)),
    "gelu": gelu_exact,
    "gelu_tanh": gelu_tanh,
    "silu": lambda x: x / (1.0 + torch.exp(-x)),
    "quick_gelu": lambda x: x / (1.0 + torch.exp(-1.702 * x)),  # CLIP: x·σ(1.702x)
    "sigmoid": lambda x: 1.0 / (1.0 + torch.exp(-x)),
    "tanh": lambda x: (torch.exp(x) - torch.exp(-x)) / (torch.exp(x) + torch.exp(-x)),
}

TORCH = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
}


@pytest.fixture
def x() -> torch.Tensor:
    # a range that reaches both tails, plus exact zero
    grid = torch.linspace(-8.0, 8.0, 161, dtype=torch.float64)
    return torch.cat([grid, torch.zeros(1, dtype=torch.float64)])


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_activation_matches_formula(name, x):
    act = seqzoo.registry().create("activation", name)
    torch.testing.assert_close(act(x), REFERENCES[name](x), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", sorted(TORCH))
def test_activation_matches_torch_functional(name, x):
    act = seqzoo.registry().create("activation", name)
    torch.testing.assert_close(act(x.float()), TORCH[name](x.float()))


def test_gelu_approximate_tanh_matches_tanh_formula(x):
    act = seqzoo.registry().create("activation", {"kind": "gelu", "approximate": "tanh"})
    torch.testing.assert_close(act(x), gelu_tanh(x), rtol=1e-10, atol=1e-10)


def test_gelu_exact_and_tanh_differ_measurably(x):
    exact = seqzoo.registry().create("activation", "gelu")
    tanh = seqzoo.registry().create("activation", "gelu_tanh")
    gap = (exact(x) - tanh(x)).abs().max().item()
    assert 1e-4 < gap < 1e-3


def test_quick_gelu_is_not_gelu(x):
    quick = seqzoo.registry().create("activation", "quick_gelu")
    assert (quick(x) - gelu_exact(x)).abs().max().item() > 1e-2


@pytest.mark.parametrize("name", sorted(REFERENCES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_activation_keeps_shape_and_dtype(name, dtype):
    act = seqzoo.registry().create("activation", name)
    x = torch.randn(2, 3, 5, dtype=dtype)
    y = act(x)
    assert y.shape == x.shape and y.dtype == dtype


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_activation_gradcheck_float64(name):
    act = seqzoo.registry().create("activation", name)
    x = (torch.randn(2, 3, dtype=torch.float64) + 0.1).requires_grad_()  # keep relu off its kink
    assert torch.autograd.gradcheck(act, (x,))


def test_swish_alias_resolves_to_silu():
    reg = seqzoo.registry()
    assert reg.get("activation", "swish") is reg.get("activation", "silu")


def test_gelu_rejects_unknown_approximation_with_suggestion():
    with pytest.raises(seqzoo.RegistryError, match=r"activation\.approximate: 'tnh' is not one of "
                                                   r"'none', 'tanh'; did you mean 'tanh'\?"):
        seqzoo.registry().create("activation", {"kind": "gelu", "approximate": "tnh"})


def test_gelu_tanh_takes_no_params():
    with pytest.raises(seqzoo.RegistryError, match=r"unknown key 'approximate'; allowed keys: none"):
        seqzoo.registry().create("activation", {"kind": "gelu_tanh", "approximate": "none"})


def test_unknown_activation_suggests_closest():
    with pytest.raises(seqzoo.RegistryError, match=r"unknown activation 'slu'; did you mean 'silu'\?"):
        seqzoo.registry().create("activation", "slu")
