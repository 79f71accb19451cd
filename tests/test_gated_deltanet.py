"""Gated DeltaNet against transformers (the layers of Qwen3-Next, Qwen3.5 and OLMo-Hybrid with their
weights copied in), against the layer written out by hand over ``seqzoo.reference.delta_rule``
(``matches_reference``), DeltaNet (``gate: false``), and the configuration errors. The shared
machinery, and its parity with transformers' gated-delta-rule functions, are in test_delta_rule.py."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import seqzoo
from seqzoo.errors import ConfigError
from seqzoo.plugins.mixer._delta_rule import l2norm
from seqzoo.plugins.mixer.gated_deltanet import qwen3_next_layout
from seqzoo.reference.delta_rule import delta_rule
from seqzoo.testing import matches_reference
from seqzoo.testing.mixer import _full
from seqzoo.train.distributed import undecayed

qwen3_next = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
C, G, D_K, H, D_V = 32, 2, 8, 4, 6  # two key heads of 8, four value heads of 6
SHAPE = {"hidden_size": C, "linear_num_key_heads": G, "linear_key_head_dim": D_K, "linear_num_value_heads": H,
         "linear_value_head_dim": D_V, "linear_conv_kernel_dim": 4}


def mixer(**options) -> torch.nn.Module:
    spec = {"kind": "gated_deltanet", "heads": G, "head_dim": D_K, "value_heads": H, "value_head_dim": D_V,
            "chunk": 8, **options}
    return seqzoo.registry().create("mixer", spec, C).eval()


def randomised(module: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0, 0.3)
    return module.eval()


def qwen3_next_layer():
    from transformers.models.qwen3_next.configuration_qwen3_next import Qwen3NextConfig
    hf = randomised(qwen3_next.Qwen3NextGatedDeltaNet(Qwen3NextConfig(**SHAPE, rms_norm_eps=1e-6), 0))
    rows = torch.cat([hf.in_proj_qkvz.weight, hf.in_proj_ba.weight])[qwen3_next_layout(G, H, D_K, D_V)]
    return hf, {"in_proj": rows, "norm": hf.norm.weight, "out_proj": hf.out_proj.weight}, {}


def qwen3_5_layer():
    from transformers.models.qwen3_5 import configuration_qwen3_5, modeling_qwen3_5
    config = configuration_qwen3_5.Qwen3_5TextConfig(**SHAPE, rms_norm_eps=1e-6, num_hidden_layers=1,
                                                      layer_types=["linear_attention"])
    hf = randomised(modeling_qwen3_5.Qwen3_5GatedDeltaNet(config, 0))
    rows = torch.cat([hf.in_proj_qkv.weight, hf.in_proj_z.weight, hf.in_proj_b.weight, hf.in_proj_a.weight])
    return hf, {"in_proj": rows, "norm": hf.norm.weight, "out_proj": hf.out_proj.weight}, {}


def olmo_hybrid_layer():
    from transformers.models.olmo_hybrid import configuration_olmo_hybrid, modeling_olmo_hybrid
    config = configuration_olmo_hybrid.OlmoHybridConfig(**SHAPE, num_hidden_layers=2,
                                                        layer_types=["linear_attention", "full_attention"])
    hf = randomised(modeling_olmo_hybrid.OlmoHybridGatedDeltaNet(config, 0))
    assert hf.allow_neg_eigval
    rows = torch.cat([getattr(hf, f"{p}_proj").weight for p in "qkvgba"])  # g_proj is the output gate z
    return hf, {"in_proj": rows, "norm": hf.o_norm.weight, "out_proj": hf.o_proj.weight}, \
        {"allow_neg_eigval": True, "norm_eps": 1e-5}  # OLMo-Hybrid's o_norm has fla's ε


@pytest.mark.parametrize("layer", [qwen3_next_layer, qwen3_5_layer, olmo_hybrid_layer],
                         ids=["qwen3_next", "qwen3_5", "olmo_hybrid"])
def test_the_mixer_equals_the_transformers_layer_with_its_weights(layer):
    """The layers of docs/formulas.md §15.4's mapping, weights copied across, in float32:
    21 tokens in chunks of 8 (transformers' chunks are 64)."""
    hf, weights, options = layer()
    ours = mixer(**options)
    with torch.no_grad():
        ours.in_proj.weight.copy_(weights["in_proj"])
        ours.conv1d.weight.copy_(hf.conv1d.weight)
        ours.A_log.copy_(hf.A_log)
        ours.dt_bias.copy_(hf.dt_bias)
        ours.norm.weight.copy_(weights["norm"])
        ours.out_proj.weight.copy_(weights["out_proj"])
        x = torch.randn(2, 21, C)
        expected = hf(x)
        assert (_full(ours, x) - expected).abs().max() <= 1e-5 * expected.abs().max()


# -- the layer written out by hand over seqzoo.reference.delta_rule ---------------------------------
def through_gated_deltanet(m, x, run):
    """docs/formulas.md §15.4 in float64: in_proj, conv + SiLU over [q | k | v], L2-normalised
    q and k, g = −exp(A_log)·softplus(a + dt_bias), β = σ(b) (2σ(b) with allow_neg_eigval), the
    delta rule, RMSNorm per value head times w and SiLU(z), out_proj."""
    keys, values = m.key_heads * m.head_dim, m.heads * m.value_head_dim
    qkv, z, b, a = m.in_proj(x).split([2 * keys + values, values, m.heads, m.heads if m.gate else 0], -1)
    qkv = F.silu(m.conv1d(F.pad(qkv.transpose(1, 2), (m.kernel - 1, 0))).transpose(1, 2))
    q, k, v = qkv.split([keys, keys, values], -1)
    q, k = (t.unflatten(-1, (m.key_heads, -1)) for t in (q, k))
    q, k = (t / (t.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt() for t in (q, k))
    beta = torch.sigmoid(b) * (2 if m.allow_neg_eigval else 1)
    g = -torch.exp(m.A_log) * F.softplus(a + m.dt_bias) if m.gate else None
    o, _ = run(q, k, v.unflatten(-1, (m.heads, -1)), beta, g)
    o = F.rms_norm(o, (m.value_head_dim,), m.norm.weight, eps=m.norm.eps) * F.silu(z.unflatten(-1, (m.heads, -1)))
    return m.out_proj(o.flatten(2))


@pytest.mark.parametrize("options", [{}, {"gate": False}, {"allow_neg_eigval": True, "conv_bias": True}],
                         ids=["gated", "deltanet", "negative-eigenvalues"])
def test_the_mixer_matches_the_delta_rule_recurrence(options):
    matches_reference(mixer(**options), delta_rule, through_gated_deltanet)


def test_without_gate_it_is_deltanet_with_no_decay_parameters():
    deltanet = mixer(gate=False)
    names = {name for name, _ in deltanet.named_parameters()}
    assert names == {"in_proj.weight", "conv1d.weight", "norm.weight", "out_proj.weight"}
    assert deltanet.in_proj.weight.shape == (2 * G * D_K + 2 * H * D_V + H, C)  # no a rows
    assert deltanet.no_weight_decay == () and undecayed(deltanet) == set()  # the optimizer finds nothing to skip


def test_the_parameters_follow_qwen3_next():
    layer = mixer()
    assert layer.in_proj.weight.shape == (2 * G * D_K + 2 * H * D_V + 2 * H, C)
    assert layer.conv1d.weight.shape == (2 * G * D_K + H * D_V, 1, 4) and layer.conv1d.bias is None
    assert layer.A_log.shape == layer.dt_bias.shape == (H,) and layer.norm.weight.shape == (D_V,)
    assert 1 <= torch.exp(layer.A_log).min() and torch.exp(layer.A_log).max() <= 16
    step = F.softplus(layer.dt_bias)
    assert step.min() >= 0.001 - 1e-6 and step.max() <= 0.1 + 1e-6
    assert set(layer.no_weight_decay) == {"A_log", "dt_bias"} and layer.residual_projections == ("out_proj",)


def test_configuration_errors_name_the_option_and_the_fix():
    with pytest.raises(ConfigError, match=r"value_heads=3 must be a multiple of heads=2"):
        mixer(value_heads=3)
    with pytest.raises(ConfigError, match=r"dim=32 must be divisible by heads=3, or set head_dim"):
        seqzoo.registry().create("mixer", {"kind": "gated_deltanet", "heads": 3}, C)
    with pytest.raises(ConfigError, match=r"dt_min=0.5 is above dt_max=0.1; swap them"):
        mixer(dt_min=0.5, dt_max=0.1)


def test_the_l2_norm_adds_its_epsilon_inside_the_root():
    x = torch.tensor([[3.0, 4.0]])
    assert torch.allclose(l2norm(x), x / (25 + 1e-6) ** 0.5)
