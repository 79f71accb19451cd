"""This package's components pass seqzoo's conformance kit and build from the example recipes.

Run with the package installed (``pip install -e .``), so seqzoo finds it through its entry point.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import seqzoo
from seqzoo.testing import checks_for, run_check

OURS = [("score", "sigmoid"), ("position", "kerple"), ("cell", "mingru"), ("mixer", "causal_conv")]
RECIPES = Path(__file__).resolve().parents[1] / "recipes"
CASES = [(kind, name, check) for kind, name in OURS for check in checks_for(kind, name)]


@pytest.mark.parametrize("kind, name, check", CASES, ids=["/".join(c) for c in CASES])
def test_component_passes_the_kit(kind, name, check):
    # Sigmoid attention declares normalization = "sigmoid", so the kit skips its softmax check.
    run_check(kind, name, check)


def test_components_are_attributed_to_this_distribution():
    for kind, name in OURS:
        component = seqzoo.registry().get(kind, name)
        assert component.distribution == "seqzoo-example-plugin" and component.plugin == "example"


def test_sigmoid_weights_are_sigmoids_of_the_logits():
    score = seqzoo.registry().create("score", {"kind": "sigmoid", "context": 4}, 8, 8, 2)
    q, k, v = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8), torch.eye(3).expand(1, 2, 3, 3)
    weights = score.attend(q, k, v)  # v = identity, so the output is the weight matrix
    expected = torch.sigmoid(q @ k.transpose(-2, -1) / 8 ** 0.5 - torch.log(torch.tensor(4.0)))
    torch.testing.assert_close(weights, expected)


@pytest.mark.parametrize("recipe", sorted(p.name for p in RECIPES.glob("*.yaml")))
def test_recipe_builds_saves_and_loads(recipe, tmp_path):
    try:
        model = seqzoo.build(RECIPES / recipe, device="cpu").eval()
    except seqzoo.RecipeError as error:
        if "unknown model" in str(error):
            pytest.skip(f"this seqzoo lacks the model the recipe uses: {error}")
        raise
    ids = torch.randint(0, 256, (1, 5))
    seqzoo.save(model, tmp_path / "m.safetensors")
    again = seqzoo.load(tmp_path / "m.safetensors")
    with torch.no_grad():
        torch.testing.assert_close(again(ids), model(ids))


def test_kerple_bias_matches_the_formula_at_init():
    scheme = seqzoo.registry().create("position", {"kind": "kerple", "r1": 2.0, "r2": 0.5}, 16, 4, 2, 32)
    pos = torch.arange(3)[None]
    bias = scheme.bias(torch.zeros(1, 2, 3, 4), pos, pos)  # (1, H, T, S)
    assert bias.shape == (1, 2, 3, 3)
    # worked example: |0 − 2| = 2 -> −2·ln(1 + 0.5·2) = −2·ln 2; the diagonal is 0
    torch.testing.assert_close(bias[0, :, 0, 2], torch.full((2,), -2 * torch.log(torch.tensor(2.0)).item()))
    torch.testing.assert_close(bias[0, 1].diagonal(), torch.zeros(3))


def test_mingru_step_matches_the_paper_formula():
    cell = seqzoo.registry().create("cell", "mingru", 3, 2)
    x, h = torch.randn(4, 3), torch.randn(4, 2)
    w, b = cell.proj.weight, cell.proj.bias
    z = torch.sigmoid(x @ w[:2].T + b[:2])
    candidate = x @ w[2:].T + b[2:]
    out, state = cell.step(x, h)
    torch.testing.assert_close(out, (1 - z) * h + z * candidate)
    assert state is out


def test_causal_conv_matches_the_formula_and_decodes_from_its_last_inputs():
    from seqzoo.nn.attention import self_attention_inputs
    from seqzoo.nn.cache import DecodeCache

    mixer = seqzoo.registry().create("mixer", {"kind": "causal_conv", "kernel": 3, "activation": "none"}, 4)
    none = seqzoo.registry().create("position", "none", 4, 4, 1, 16)
    x = torch.randn(2, 6, 4)
    with torch.no_grad():
        out = mixer(x, self_attention_inputs(none, torch.arange(6)[None], causal=True))
        # u_t = Σ_i w_i · x_{t−i} + b with weight[c, 0, k − 1 − i] = w_{c,i}; zeros before token 0
        w, padded = mixer.weight[:, 0], torch.cat([torch.zeros(2, 2, 4), x], dim=1)
        u = sum(w[:, 2 - i] * padded[:, 2 - i:2 - i + 6] for i in range(3)) + mixer.bias
        torch.testing.assert_close(out, mixer.out_proj(u))
        cache = DecodeCache([mixer.new_state(2, 6)], 2, 6)
        mixer(x[:, :4], self_attention_inputs(none, torch.arange(4)[None], causal=True, cache=cache),
              cache.states[0])
    torch.testing.assert_close(cache.states[0].buffer, x[:, 2:4])  # the state: the last k − 1 inputs
