"""The ``geglu`` FFN (Shazeer 2020; T5 v1.1, Gemma): down(GELU(gate x) ⊙ up x)."""
from __future__ import annotations

import math

import pytest
import torch

import seqzoo


def gelu_exact(h):
    return 0.5 * h * (1.0 + torch.erf(h / math.sqrt(2.0)))


def gelu_tanh(h):
    return 0.5 * h * (1.0 + torch.tanh(0.7978845608 * (h + 0.044715 * h**3)))


def make(dim: int = 8, **params):
    return seqzoo.registry().create("ffn", {"kind": "geglu", **params}, dim)


@pytest.mark.parametrize("approximate,formula", [("none", gelu_exact), ("tanh", gelu_tanh)])
def test_output_matches_direct_computation(approximate, formula):
    ffn = make(hidden=12, approximate=approximate).double()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    expected = (formula(x @ ffn.gate.weight.T) * (x @ ffn.up.weight.T)) @ ffn.down.weight.T
    torch.testing.assert_close(ffn(x), expected, rtol=1e-10, atol=1e-10)


def test_gelu_is_on_the_gate_branch_not_up():
    # gate pre-activations are -20, where GELU ≈ 0; up's are 1. Swapped would give GELU(1)·(-20).
    ffn = make(dim=4, hidden=4)
    with torch.no_grad():
        ffn.gate.weight.copy_(-20.0 * torch.eye(4))
        ffn.up.weight.copy_(torch.eye(4))
        ffn.down.weight.copy_(torch.eye(4))
    assert ffn(torch.ones(1, 1, 4)).abs().max().item() < 1e-6


def test_shares_the_llama_hidden_rule():
    with torch.device("meta"):
        ffn = make(4096, multiple_of=256)
    assert ffn.hidden == 11008 and set(ffn.state_dict()) == {"gate.weight", "up.weight", "down.weight"}


def test_hidden_not_a_multiple_is_rejected_naming_geglu():
    with pytest.raises(seqzoo.ConfigError,
                       match=r"^geglu: hidden=10 must be a multiple of multiple_of=4; use hidden=12"):
        make(hidden=10, multiple_of=4)


def test_gradcheck_float64():
    ffn = make(3, hidden=4, approximate="tanh").double()
    x = torch.randn(1, 2, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(ffn, (x,))


def test_builds_from_recipe():
    model = seqzoo.build("tiny-gpt", ["model.ffn={kind: geglu, approximate: tanh}"], device="cpu").eval()
    assert model.decoder.blocks[0].ffn.hidden == 170
    assert model(torch.randint(0, 259, (1, 5))).shape == (1, 5, 259)
