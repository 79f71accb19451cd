"""Kimi Delta Attention against transformers (``KimiLinearDeltaAttention`` with its weights copied
in), against the layer written out by hand over ``seqzoo.reference.delta_rule`` with a decay per
key channel (``matches_reference``), and the configuration error. The shared machinery, and its
parity with transformers' Kimi-delta-attention functions, are in test_delta_rule.py."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import seqzoo
from seqzoo.errors import ConfigError
from seqzoo.reference.delta_rule import delta_rule
from seqzoo.testing import matches_reference
from seqzoo.testing.mixer import _full

kimi = pytest.importorskip("transformers.models.kimi_linear.modeling_kimi_linear")
C, H, D = 32, 2, 8


def mixer(**options) -> torch.nn.Module:
    return seqzoo.registry().create("mixer", {"kind": "kda", "heads": H, "head_dim": D, "chunk": 8, **options},
                                    C).eval()


def test_the_mixer_equals_kimi_linear_delta_attention_with_its_weights():
    """docs/formulas.md §15.5's mapping, weights copied across, in float32: 21 tokens in chunks of 8
    (transformers' chunks are 64)."""
    from transformers.models.kimi_linear.configuration_kimi_linear import KimiLinearConfig
    config = KimiLinearConfig(hidden_size=C, num_hidden_layers=1, rms_norm_eps=1e-5, linear_attn_config={
        "head_dim": D, "num_heads": H, "short_conv_kernel_size": 4, "kda_layers": [1], "full_attn_layers": []})
    hf = kimi.KimiLinearDeltaAttention(config, 0).eval()
    ours = mixer()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, 0.3)
        gate = hf.forget_gate
        ours.in_proj.weight.copy_(torch.cat([hf.q_proj.weight, hf.k_proj.weight, hf.v_proj.weight,
                                             gate.f_a_proj.weight, hf.b_proj.weight, hf.g_a_proj.weight]))
        ours.conv1d.weight.copy_(hf.conv1d.weight)
        ours.f_b_proj.weight.copy_(gate.f_b_proj.weight)
        ours.A_log.copy_(gate.A_log.flatten())  # (1, 1, H, 1) there
        ours.dt_bias.copy_(gate.dt_bias)
        ours.g_b_proj.weight.copy_(hf.g_b_proj.weight)
        ours.norm.weight.copy_(hf.o_norm.weight)
        ours.out_proj.weight.copy_(hf.o_proj.weight)
        x = torch.randn(2, 21, C)
        expected = hf(x)
        assert (_full(ours, x) - expected).abs().max() <= 1e-5 * expected.abs().max()


def through_kda(m, x, run):
    """docs/formulas.md §15.5 in float64: in_proj, conv + SiLU over [q | k | v], L2-normalised q and
    k, g = −exp(A_log)·softplus(f_b_proj(f) + dt_bias) per key channel, β = σ(b), the delta rule,
    RMSNorm per head times w and σ(g_b_proj(r)), out_proj."""
    inner = m.heads * m.head_dim
    qkv, f, b, r = m.in_proj(x).split([3 * inner, m.rank, m.heads, m.rank], -1)
    qkv = F.silu(m.conv1d(F.pad(qkv.transpose(1, 2), (m.kernel - 1, 0))).transpose(1, 2))
    q, k, v = (t.unflatten(-1, (m.heads, -1)) for t in qkv.split(inner, -1))
    q, k = (t / (t.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt() for t in (q, k))
    a = (m.f_b_proj(f) + m.dt_bias).unflatten(-1, (m.heads, -1))
    g = -torch.exp(m.A_log)[:, None] * F.softplus(a)
    o, _ = run(q, k, v, torch.sigmoid(b) * (2 if m.allow_neg_eigval else 1), g)
    gate = torch.sigmoid(m.g_b_proj(r)).unflatten(-1, (m.heads, -1))
    return m.out_proj((F.rms_norm(o, (m.head_dim,), m.norm.weight, eps=m.norm.eps) * gate).flatten(2))


@pytest.mark.parametrize("options", [{}, {"rank": 3, "gate_bias": True, "allow_neg_eigval": True}],
                         ids=["kimi-linear", "rank3-gate-bias-negative-eigenvalues"])
def test_the_mixer_matches_the_delta_rule_recurrence_with_a_decay_per_channel(options):
    matches_reference(mixer(**options), delta_rule, through_kda)


def test_the_parameters_follow_kimi_linear():
    layer = mixer()
    assert layer.in_proj.weight.shape == (3 * H * D + 2 * D + H, C)  # rank = head_dim
    assert layer.conv1d.weight.shape == (3 * H * D, 1, 4) and layer.conv1d.bias is None
    assert layer.f_b_proj.weight.shape == layer.g_b_proj.weight.shape == (H * D, D) and layer.g_b_proj.bias is None
    assert layer.A_log.shape == (H,) and layer.dt_bias.shape == (H * D,) and layer.norm.weight.shape == (D,)
    assert set(layer.no_weight_decay) == {"A_log", "dt_bias"} and layer.residual_projections == ("out_proj",)


def test_a_width_that_does_not_split_into_heads_is_refused():
    with pytest.raises(ConfigError, match=r"kda: dim=32 must be divisible by heads=3, or set head_dim"):
        seqzoo.registry().create("mixer", {"kind": "kda", "heads": 3}, C)
