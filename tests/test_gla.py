"""Gated linear attention (``gla``): the chunked form and the decode step against
``seqzoo.reference.gla`` (token by token, float64) with a decay per key channel (GLA) and a fixed
one per head (lightning attention), at lengths that are not multiples of the chunk and from an
initial state; the float32 gradients; steep decays; the lightning options against transformers'
``MiniMaxLightningAttention`` (called, weights copied in); the layer against its formula over the
reference (``matches_reference``); the options' errors. The checks every recurrent mixer shares
(segments, bfloat16, fla on CUDA) are in test_recurrent_mixers.py, the shipped recipes' decoding
and layout in test_recurrent_recipes.py."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import seqzoo
from seqzoo.errors import ConfigError, InputError
from seqzoo.plugins.mixer._gla import chunked, gated_linear_attention
from seqzoo.plugins.mixer.gla import minimax_decay_scale, minimax_layout
from seqzoo.reference.gla import gla
from seqzoo.testing import gradients_match_reference, matches_reference, relative_difference
from seqzoo.testing.mixer import _full, _pieces

F64 = torch.float64
HEADS, WIDTH, VALUE_WIDTH = 3, 5, 4
DECAYS = ["channel", "head_fixed"]


def inputs(decay: str, length: int = 45, rate: float = 1.0, batch: int = 2, dtype=F64) -> dict:
    """q, k (B, T, 3, 5); v (B, T, 3, 4); the log-decays ≤ 0 (per channel, or a rate per head with
    steps of 1); S_0. ``g`` is what the reference takes: the per-channel decays, or steps · rate."""
    gen = torch.Generator().manual_seed(1)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=F64)

    t = {"q": randn(batch, length, HEADS, WIDTH), "k": randn(batch, length, HEADS, WIDTH),
         "v": randn(batch, length, HEADS, VALUE_WIDTH), "state": randn(batch, HEADS, WIDTH, VALUE_WIDTH)}
    if decay == "channel":
        t["log_decay"] = t["g"] = -F.softplus(randn(batch, length, HEADS, WIDTH)) * rate
        t["steps"] = None
    else:
        t["log_decay"] = -torch.rand(HEADS, generator=gen, dtype=F64) * rate
        t["steps"] = torch.ones(batch, length, HEADS, dtype=F64)
        t["g"] = t["steps"] * t["log_decay"]
    return {name: None if x is None else x.to(dtype) for name, x in t.items()}


def run(t: dict, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    return gated_linear_attention(t["q"], t["k"], t["v"], t["log_decay"], t["state"], chunk, WIDTH ** -0.5,
                                  t["steps"])


def run_reference(t: dict) -> tuple[torch.Tensor, torch.Tensor]:
    return gla(t["q"], t["k"], t["v"], t["g"], state=t["state"])


@pytest.mark.parametrize("chunk", [1, 7, 64])
@pytest.mark.parametrize("decay", DECAYS)
def test_chunked_form_equals_the_recurrence_in_float64(decay, chunk):
    t = inputs(decay)  # 45 tokens: 6 chunks of 7 and a remainder of 3; one padded chunk of 64
    assert relative_difference(run(t, chunk), run_reference(t)) <= 1e-12


def test_steep_channel_decays_neither_overflow_nor_drift():
    """Decays of e^−60 per step (a chunk of 64 spans e^−3800): every exponent is a difference
    Γ_t − Γ_s ≤ 0, so the chunked form stays finite and exact."""
    t = inputs("channel", rate=60.0)
    out, last = run(t, 64)
    assert torch.isfinite(out).all() and torch.isfinite(last).all()
    assert relative_difference((out, last), run_reference(t)) <= 1e-12


@pytest.mark.parametrize("decay", DECAYS)
def test_chunked_form_in_float32_stays_within_1e_5_of_float64(decay):
    t = inputs(decay, length=200, rate=0.05)  # slow decays: long memories, the hard case for rounding
    expected, final = run_reference(t)
    out, last = run(inputs(decay, length=200, rate=0.05, dtype=torch.float32), 16)
    assert out.dtype == last.dtype == torch.float32
    assert relative_difference((out, last), (expected, final)) <= 1e-5


@pytest.mark.parametrize("decay", DECAYS)
def test_float32_gradients_of_the_chunked_form_match_the_float64_recurrence(decay):
    """Every input's gradient (q, k, v, the log-decays, S_0), float32 chunks of 16 over 50 tokens
    against float64 autograd through the token-by-token recurrence (its g made from the same
    log-decay leaf)."""
    def recurrence(t: dict) -> tuple[torch.Tensor, torch.Tensor]:
        g = t["log_decay"] if decay == "channel" else t["steps"] * t["log_decay"]
        return run_reference({**t, "g": g})

    gradients_match_reference(lambda t: run(t, 16), recurrence, inputs(decay, length=50),
                              grad=["q", "k", "v", "log_decay", "state"])


@pytest.mark.parametrize("decay", DECAYS)
def test_decode_steps_equal_the_recurrence(decay):
    t = inputs(decay, length=9)
    expected, final = run_reference(t)
    S = t["state"]
    for i in range(9):
        piece = {**t, "state": S, **{name: t[name][:, i:i + 1] for name in ("q", "k", "v")}}
        piece["log_decay"] = t["log_decay"][:, i:i + 1] if decay == "channel" else t["log_decay"]
        piece["steps"] = None if decay == "channel" else t["steps"][:, i:i + 1]
        o, S = run(piece, 64)
        assert torch.allclose(o[:, 0], expected[:, i], atol=1e-12)
    assert torch.allclose(S, final, atol=1e-12)


@pytest.mark.parametrize("decay", DECAYS)
def test_padded_steps_leave_the_state_as_it_was(decay):
    """Zero values and no decay (per-channel log-decays 0, or steps 0): the state does not move,
    through the chunked form and the decode step."""
    t = inputs(decay, length=4)
    t["v"] = torch.zeros_like(t["v"])
    t["log_decay"] = torch.zeros_like(t["log_decay"]) if decay == "channel" else t["log_decay"]
    t["steps"] = None if decay == "channel" else torch.zeros_like(t["steps"])
    assert torch.equal(run(t, 64)[1], t["state"])
    one = {**t, **{name: t[name][:, :1] for name in ("q", "k", "v")}}
    one["log_decay"] = t["log_decay"][:, :1] if decay == "channel" else t["log_decay"]
    one["steps"] = None if decay == "channel" else t["steps"][:, :1]
    assert torch.equal(run(one, 64)[1], t["state"])


def test_the_chunked_form_starts_from_zeros_without_a_state():
    t = inputs("channel", length=20)
    expected, _ = gla(t["q"], t["k"], t["v"], t["g"], scale=1.0)
    assert torch.allclose(chunked(t["q"], t["k"], t["v"], t["g"], None, 8)[0], expected, atol=1e-12)


def test_the_reference_refuses_a_decay_of_another_shape():
    t = inputs("channel", length=3)
    with pytest.raises(InputError, match=r"reference.gla: g has shape \(2, 3, 3, 2\); give \(B, T, H, D_k\)"):
        gla(t["q"], t["k"], t["v"], t["g"][..., :2])


# -- the lightning options against transformers' MiniMax-01 layer -----------------------------------
C, H, D = 32, 4, 8
LIGHTNING = {"decay": "head_fixed", "feature_map": "silu", "scale": 1.0, "norm": "whole", "gate": "sigmoid",
             "norm_eps": 1e-6}


def mixer(**options) -> torch.nn.Module:
    spec = {"kind": "gla", "heads": H, "head_dim": D, "gate_rank": 4, "chunk": 8, **options}
    return seqzoo.registry().create("mixer", spec, C).eval()


def minimax_pair(layer: int, layers: int = 4):
    """transformers' MiniMaxLightningAttention of layer ``layer`` (its blocks of 8; the decay
    depends on the depth) and this mixer with its weights and decay_scale, both float32."""
    minimax = pytest.importorskip("transformers.models.minimax.modeling_minimax")
    from transformers.models.minimax.configuration_minimax import MiniMaxConfig
    config = MiniMaxConfig(hidden_size=C, num_attention_heads=H, head_dim=D, num_hidden_layers=layers,
                           num_key_value_heads=2, intermediate_size=64, num_local_experts=2, block_size=8,
                           layer_types=["linear_attention"] * (layers - 1) + ["full_attention"])
    hf = minimax.MiniMaxLightningAttention(config, layer).eval()
    ours = mixer(**LIGHTNING, decay_scale=minimax_decay_scale(layer, layers), chunk=16)
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, 0.3)
        ours.in_proj.weight.copy_(torch.cat([hf.qkv_proj.weight[minimax_layout(H, D)], hf.output_gate.weight]))
        ours.norm.weight.copy_(hf.norm.weight)
        ours.out_proj.weight.copy_(hf.out_proj.weight)
    return minimax, hf, ours


@pytest.mark.parametrize("layer", [0, 2])
def test_the_lightning_options_equal_minimax_lightning_attention(layer):
    """21 tokens: transformers' blocks of 8 (two and a remainder), ours of 16, in float32; layers 0
    and 2 of 4 (the decay scaled by 1 and by ~⅓)."""
    _, hf, ours = minimax_pair(layer)
    with torch.no_grad():
        x = torch.randn(2, 21, C)
        expected, _ = hf(x, None, None)
        assert (_full(ours, x) - expected).abs().max() <= 1e-5 * expected.abs().max()
        assert (_pieces(ours, x)[0] - expected).abs().max() <= 1e-5 * expected.abs().max()


def test_decoding_from_a_state_equals_minimax_recurrent_branch():
    """With a linear cache, transformers' layer steps token by token (its decode branch): the same
    state S_0 in both, then 5 tokens; the outputs and the state after them agree."""
    minimax, hf, ours = minimax_pair(1)
    with torch.no_grad():
        S = torch.randn(2, H, D, D) * 0.3
        x = torch.randn(2, 5, C)
        cache = minimax.MiniMaxCache()
        cache.set_linear_cache(1, S.clone())
        expected, final = hf(x, None, None, cache=cache)
        state = ours.new_state(2, 5)
        state.S = S.clone()
        context = seqzoo.testing.mixer._context
        got = torch.cat([ours(x[:, t:t + 1], context(torch.tensor([[t]])), state) for t in range(5)], 1)
    assert (got - expected).abs().max() <= 1e-5 * expected.abs().max()
    assert (state.S - final).abs().max() <= 1e-5 * final.abs().max()


@pytest.mark.parametrize("layer", [0, 1, 3])
def test_the_fixed_rates_are_minimax_slopes_at_each_depth(layer):
    """λ_h = 2^{−8(h+1)/H} · (1 − l / (L − 1 + 10⁻⁵) + 10⁻⁵): MiniMax's own ``slope_rate`` buffer."""
    _, hf, ours = minimax_pair(layer)
    assert torch.allclose(-torch.tensor(ours.rates), hf.slope_rate.flatten(), rtol=1e-6, atol=0)


def test_minimax_rows_reorder_from_per_head_to_per_kind():
    rows = minimax_layout(2, 3)  # head 0: rows 0-8 (q 0-2, k 3-5, v 6-8), head 1: 9-17
    assert rows.tolist() == [0, 1, 2, 9, 10, 11, 3, 4, 5, 12, 13, 14, 6, 7, 8, 15, 16, 17]


# -- the layer written out by hand over seqzoo.reference.gla ----------------------------------------
def through_gla(m, x, run):
    """docs/formulas.md §15.6 in float64: in_proj, φ, the log-decays (logsigmoid of the low-rank gate
    / 16, or the fixed rates), the recurrence, the RMSNorm (per head or whole) times w, the output
    gate (SiLU or σ) after it, out_proj."""
    q, k, v, z, r = m.in_proj(x).split(m.sizes, -1)
    if m.feature_map == "silu":
        q, k, v = F.silu(q), F.silu(k), F.silu(v)
    q, k = (t.unflatten(-1, (m.heads, -1)) for t in (q, k))
    v = v.unflatten(-1, (m.heads, -1))
    if m.decay == "channel":
        g = F.logsigmoid(m.gk_proj(r)).unflatten(-1, (m.heads, -1)) / m.gate_normalizer
    else:
        g = torch.tensor(m.rates, dtype=x.dtype).expand(*x.shape[:2], m.heads)
    o, _ = run(q, k, v, g, scale=m.scale)
    per_head = m.norm.weight.numel() == m.value_head_dim
    o = F.rms_norm(o, (m.value_head_dim,), m.norm.weight, m.norm.eps) if per_head else \
        F.rms_norm(o.flatten(2), (o.shape[2] * o.shape[3],), m.norm.weight, m.norm.eps)
    gate = F.silu(z) if m.norm.activation is F.silu else torch.sigmoid(z)
    return m.out_proj(o.flatten(2) * gate)


@pytest.mark.parametrize("options", [{"value_head_dim": 6}, LIGHTNING, {"feature_map": "silu", "gate": "sigmoid",
                                                                          "norm": "whole", "gate_normalizer": 4.0}],
                         ids=["gla", "lightning", "gla-silu-sigmoid-whole"])
def test_the_mixer_matches_the_gla_recurrence(options):
    matches_reference(mixer(**options), gla, through_gla)


def test_the_parameters_follow_fla_gla():
    layer = mixer(head_dim=4, value_head_dim=8)  # fla's shape: D_k = C / 2H, D_v = C / H
    assert layer.in_proj.weight.shape == (2 * H * 4 + 2 * H * 8 + 4, C)
    assert layer.gk_proj.weight.shape == (H * 4, 4) and layer.gk_proj.bias.shape == (H * 4,)
    assert layer.norm.weight.shape == (8,) and layer.out_proj.weight.shape == (C, H * 8)
    lightning = mixer(**LIGHTNING)
    assert {name for name, _ in lightning.named_parameters()} == {"in_proj.weight", "norm.weight", "out_proj.weight"}
    assert lightning.norm.weight.shape == (H * D,) and lightning.in_proj.weight.shape == (4 * H * D, C)
    assert lightning.residual_projections == ("out_proj",)


@pytest.mark.parametrize("option, value", [("decay", "head"), ("feature_map", "elu"), ("norm", "group"),
                                           ("gate", "relu")])
def test_an_unknown_option_value_is_refused_with_the_choices(option, value):
    with pytest.raises(ConfigError, match=rf"gla: {option}={value!r} is not one of "):
        mixer(**{option: value})


def test_a_width_that_does_not_split_into_heads_is_refused():
    with pytest.raises(ConfigError, match=r"gla: dim=32 must be divisible by heads=3, or set head_dim"):
        seqzoo.registry().create("mixer", {"kind": "gla", "heads": 3}, C)
