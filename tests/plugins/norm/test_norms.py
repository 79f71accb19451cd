"""LayerNorm and RMSNorm against torch's own modules and docs/formulas.md §10."""
from __future__ import annotations

import torch

import seqzoo


def test_layernorm_matches_torch():
    ours = seqzoo.registry().create("norm", {"kind": "layernorm", "eps": 1e-12}, 16)
    ref = torch.nn.LayerNorm(16, eps=1e-12)
    with torch.no_grad():
        ours.weight.normal_()
        ours.bias.normal_()
        ref.weight.copy_(ours.weight)
        ref.bias.copy_(ours.bias)
    x = torch.randn(3, 5, 16)
    torch.testing.assert_close(ours(x), ref(x))


def test_layernorm_without_bias_has_no_bias_parameter():
    ours = seqzoo.registry().create("norm", {"kind": "layernorm", "bias": False}, 8)
    assert [n for n, _ in ours.named_parameters()] == ["weight"]


def test_rmsnorm_matches_formula_and_torch():
    ours = seqzoo.registry().create("norm", {"kind": "rmsnorm", "eps": 1e-5}, 16)
    with torch.no_grad():
        ours.weight.normal_()
    x = torch.randn(3, 5, 16)
    formula = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * ours.weight
    torch.testing.assert_close(ours(x), formula)
    ref = torch.nn.RMSNorm(16, eps=1e-5)
    with torch.no_grad():
        ref.weight.copy_(ours.weight)
    torch.testing.assert_close(ours(x), ref(x))


def test_rmsnorm_normalises_half_inputs_in_float32():
    ours = seqzoo.registry().create("norm", "rmsnorm", 64)
    x = (torch.randn(2, 64) * 300).to(torch.float16)
    out = ours.to(torch.float16)(x)
    ref = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)
    assert out.dtype == torch.float16 and torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), ref, atol=2e-3, rtol=2e-3)


def test_norms_gradcheck_in_float64():
    for spec in ("layernorm", "rmsnorm"):
        norm = seqzoo.registry().create("norm", spec, 4).double()
        x = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(norm, (x,))
