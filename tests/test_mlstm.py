"""The mLSTM (``mlstm``): the chunked form and the decode step against ``seqzoo.reference.mlstm``
(token by token, float64) at lengths that are not multiples of the chunk, from an initial state;
the float32 gradients; large gates; padding; transformers' xLSTM functions (its chunkwise and
recurrent-step kernels) and ``xLSTMLayer`` called with the weights copied in; the layer against its
formula over the reference (``matches_reference``); the options' errors. The checks every
recurrent mixer shares (segments, bfloat16, fla on CUDA) are in test_recurrent_mixers.py, the
shipped recipe's decoding and layout in test_recurrent_recipes.py."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import seqzoo
from seqzoo.errors import ConfigError
from seqzoo.plugins.mixer import _mlstm
from seqzoo.reference.mlstm import mlstm
from seqzoo.testing import gradients_match_reference, matches_reference, relative_difference
from seqzoo.testing.mixer import _full, _pieces

F64 = torch.float64
HEADS, WIDTH, VALUE_WIDTH = 3, 5, 4
xlstm = pytest.importorskip("transformers.models.xlstm.modeling_xlstm")


def inputs(length: int = 45, gates: float = 3.0, batch: int = 2, dtype=F64) -> dict:
    """q, k (B, T, 3, 5); v (B, T, 3, 4); the gates' preactivations i, f (B, T, 3), N(0, gates²)
    (a large spread: the stabiliser m moves, and ε·e^m shows); a state (C, n, m) with m > 0."""
    gen = torch.Generator().manual_seed(1)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=F64)

    t = {"q": randn(batch, length, HEADS, WIDTH), "k": randn(batch, length, HEADS, WIDTH),
         "v": randn(batch, length, HEADS, VALUE_WIDTH), "i": randn(batch, length, HEADS) * gates,
         "f": randn(batch, length, HEADS) * gates + 2,
         "state": (randn(batch, HEADS, WIDTH, VALUE_WIDTH), randn(batch, HEADS, WIDTH), randn(batch, HEADS).abs())}
    return {name: tuple(s.to(dtype) for s in x) if name == "state" else x.to(dtype) for name, x in t.items()}


def run(t: dict, chunk: int):
    return _mlstm.mlstm(t["q"], t["k"], t["v"], t["i"], t["f"], t["state"], chunk, 1e-6)


def run_reference(t: dict):
    return mlstm(t["q"], t["k"], t["v"], t["i"], t["f"], state=t["state"])


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_chunked_form_equals_the_recurrence_in_float64(chunk):
    t = inputs()  # 45 tokens: 6 chunks of 7 and a remainder of 3; one padded chunk of 64
    expected, final = run_reference(t)
    out, last = run(t, chunk)
    assert relative_difference((out, last), (expected, final)) <= 1e-12


def test_large_gates_neither_overflow_nor_drift():
    """Preactivations of ±60 without a cap (e^60 ≈ 10²⁶; a chunk of 64 spans e^±3800 of forget
    gates): every exponent is taken relative to the running maximum m, so nothing overflows."""
    t = inputs(gates=60.0)
    expected, final = run_reference(t)
    out, last = run(t, 64)
    assert torch.isfinite(out).all() and all(torch.isfinite(s).all() for s in last)
    assert relative_difference((out, last), (expected, final)) <= 1e-12


def test_chunked_form_in_float32_stays_within_1e_5_of_float64():
    expected, final = run_reference(inputs(length=200))
    out, last = run(inputs(length=200, dtype=torch.float32), 16)
    assert out.dtype == torch.float32 and all(s.dtype == torch.float32 for s in last)
    assert relative_difference((out, last), (expected, final)) <= 1e-5


def test_float32_gradients_of_the_chunked_form_match_the_float64_recurrence():
    """Every input's gradient (q, k, v, i, f, C_0, n_0, m_0), float32 chunks of 16 over 50 tokens
    against float64 autograd through the token-by-token recurrence."""
    gradients_match_reference(lambda t: run(t, 16), run_reference, inputs(length=50))


def test_decode_steps_equal_the_recurrence():
    t = inputs(length=9)
    expected, final = run_reference(t)
    state = t["state"]
    for i in range(9):
        h, state = run({**{name: t[name][:, i:i + 1] for name in "qkvif"}, "state": state}, 64)
        assert torch.allclose(h[:, 0], expected[:, i], atol=1e-12)
    assert relative_difference(state, final) <= 1e-12


@pytest.mark.parametrize("length", [4, 1], ids=["chunked", "decode-step"])
def test_padded_steps_leave_the_state_as_it_was(length):
    """i = −∞ (no write) and f = +∞ (log σ = 0: no decay), values zero: C, n and m do not move,
    a chunk of nothing but padding included, and every gradient stays finite."""
    t = inputs(length=length)
    t["i"], t["f"] = torch.full_like(t["i"], -torch.inf), torch.full_like(t["f"], torch.inf)
    t["v"] = torch.zeros_like(t["v"])
    leaves = [x.requires_grad_() for x in (t["q"], t["k"], *t["state"])]
    h, last = run(t, 64)
    assert all(torch.equal(s, s0) for s, s0 in zip(last, t["state"]))
    (h.sum() + sum(s.sum() for s in last)).backward()
    assert all(torch.isfinite(x.grad).all() for x in leaves)


# -- transformers' xLSTM: the kernels and the layer ------------------------------------------------
def test_the_chunked_form_equals_transformers_chunkwise_kernel():
    """transformers' ``mlstm_chunkwise_native_autograd`` (chunks of 16; it takes whole chunks only)
    over 48 tokens from an initial state, against ours in chunks of 7, float32. Its layout is
    (B, H, T, D) and its m (B, H, 1)."""
    t = inputs(length=48, dtype=torch.float32)
    C0, n0, m0 = t["state"]
    heads_first = {name: t[name].transpose(1, 2) for name in "qkvif"}
    expected, (C, n, m) = xlstm.mlstm_chunkwise_native_autograd(
        query=heads_first["q"], key=heads_first["k"], value=heads_first["v"], igate=heads_first["i"],
        fgate=heads_first["f"], c_initial=C0, n_initial=n0, m_initial=m0[..., None], return_last_states=True,
        chunk_size=16)
    out, last = run(t, 7)
    assert relative_difference((out, last), (expected.transpose(1, 2), (C, n, m[..., 0]))) <= 1e-5


def test_the_decode_step_equals_transformers_recurrent_step_kernel():
    t = inputs(length=1, dtype=torch.float32)
    C0, n0, m0 = t["state"]
    expected, (C, n, m) = xlstm.mlstm_recurrent_step_native(
        query=t["q"][:, 0], key=t["k"][:, 0], value=t["v"][:, 0], igate=t["i"][:, 0, :, None],
        fgate=t["f"][:, 0, :, None], cstate=C0, nstate=n0, mstate=m0[..., None])
    out, last = run(t, 64)
    assert relative_difference((out[:, 0], last), (expected, (C, n, m[..., 0]))) <= 1e-6


C, H = 32, 2  # q/k heads of 8, value heads of 16


def mixer(**options) -> torch.nn.Module:
    return seqzoo.registry().create("mixer", {"kind": "mlstm", "heads": H, "chunk": 16, **options}, C).eval()


def xlstm_pair(weight_mode: str = "single", **config):
    """transformers' ``xLSTMLayer`` (chunks of 8, its inference mode: whole chunks, then the
    remainder through its recurrent kernel) and this mixer with its weights, float32."""
    from transformers.models.xlstm.configuration_xlstm import xLSTMConfig
    hf = xlstm.xLSTMLayer(xLSTMConfig(hidden_size=C, num_heads=H, chunk_size=8, num_hidden_layers=1, vocab_size=50,
                                      weight_mode=weight_mode, **config)).eval()
    ours = mixer(bias=config.get("use_bias", False))
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, 0.3)
        if weight_mode == "single":
            ours.qkvo_proj.weight.copy_(torch.cat([hf.q.weight, hf.k.weight, hf.v.weight, hf.ogate_preact.weight]))
            ours.if_proj.weight.copy_(torch.cat([hf.igate_preact.weight, hf.fgate_preact.weight]))
            ours.if_proj.bias.copy_(torch.cat([hf.igate_preact.bias, hf.fgate_preact.bias]))
            if ours.qkvo_proj.bias is not None:
                ours.qkvo_proj.bias.copy_(torch.cat([hf.q.bias, hf.k.bias, hf.v.bias, hf.ogate_preact.bias]))
        else:  # fused: the same two projections, already in this mixer's row order
            ours.qkvo_proj.load_state_dict(hf.qkv_opreact.state_dict())
            ours.if_proj.load_state_dict(hf.ifgate_preact.state_dict())
        ours.norm.load_state_dict(hf.multihead_norm.state_dict())
        ours.out_proj.load_state_dict(hf.out_proj.state_dict())
    return hf, ours


@pytest.mark.parametrize("weight_mode, config", [("single", {}), ("fused", {}), ("single", {"use_bias": True})],
                         ids=["single", "fused", "biases"])
def test_the_mixer_equals_transformers_xlstm_layer(weight_mode, config):
    """21 tokens (two chunks of 8 there and 5 recurrent steps; ours: a chunk of 16 and a padded
    one) in float32, decoding through the state too. The gates' preactivations spread over ±5."""
    hf, ours = xlstm_pair(weight_mode, **config)
    with torch.no_grad():
        x = torch.randn(2, 21, C)
        expected, _ = hf(x)
        assert relative_difference((_full(ours, x), _pieces(ours, x)[0]), (expected, expected)) <= 1e-5


def test_a_state_carried_between_calls_equals_transformers_state():
    """Two calls (13 tokens, then 8) through one state, against transformers' layer given its
    state back: the outputs and the (C, n, m) after them."""
    hf, ours = xlstm_pair()
    context = seqzoo.testing.mixer._context
    with torch.no_grad():
        x = torch.randn(2, 21, C)
        first, hf_state = hf(x[:, :13])
        second, (C_T, n_T, m_T) = hf(x[:, 13:], hf_state)
        state = ours.new_state(2, 21)
        got = torch.cat([ours(x[:, :13], context(torch.arange(13)[None]), state),
                         ours(x[:, 13:], context(torch.arange(13, 21)[None]), state)], 1)
    assert relative_difference(got, torch.cat([first, second], 1)) <= 1e-5
    assert relative_difference((state.C, state.n, state.m), (C_T, n_T, m_T[..., 0])) <= 1e-5


# -- the layer written out by hand over seqzoo.reference.mlstm --------------------------------------
def through_mlstm(m, x, run):
    """docs/formulas.md §15.8 in float64: qkvo_proj, the soft-capped gates, the recurrence, the
    norm over each head (LayerNorm or RMSNorm) times w (+ b), σ(o), out_proj."""
    q, k, v, o = m.qkvo_proj(x).split(m.sizes, -1)
    i, f = (m.gate_soft_cap * torch.tanh(m.if_proj(x) / m.gate_soft_cap)).chunk(2, -1)
    h, _ = run(*(t.unflatten(-1, (m.heads, -1)) for t in (q, k, v)), i, f, eps=m.eps)
    if m.norm.kind == "layernorm":
        h = F.layer_norm(h, h.shape[-1:], eps=m.norm.eps)
    else:
        h = F.rms_norm(h, h.shape[-1:], eps=m.norm.eps)
    h = h.flatten(2) * m.norm.weight + (0 if m.norm.bias is None else m.norm.bias)
    return m.out_proj(h * torch.sigmoid(o))


@pytest.mark.parametrize("options", [{}, {"norm": "rmsnorm", "bias": True, "gate_soft_cap": 5.0}],
                         ids=["xlstm-7b", "rmsnorm-biases-cap5"])
def test_the_mixer_matches_the_mlstm_recurrence(options):
    layer = mixer(**options)
    with torch.no_grad():  # gates that move: xLSTM-7B's start (zero weights, i = −10) barely writes
        layer.if_proj.weight.normal_(0, 1.0)
        layer.if_proj.bias.zero_()
    matches_reference(layer, mlstm, through_mlstm)


def test_the_parameters_and_the_gate_start_follow_xlstm_7b():
    layer = mixer()
    assert layer.qkvo_proj.weight.shape == (2 * C // 2 + 2 * C, C) and layer.qkvo_proj.bias is None
    assert layer.if_proj.weight.shape == (2 * H, C) and torch.equal(layer.if_proj.weight, torch.zeros(2 * H, C))
    assert torch.equal(layer.if_proj.bias, torch.tensor([-10.0, -10.0, 3.0, 6.0]))  # i, then f spread over [3, 6]
    assert layer.norm.weight.shape == (C,) and layer.norm.bias is None
    assert set(layer.keep_init) == {"if_proj.weight", "if_proj.bias"} and layer.residual_projections == ("out_proj",)
    state = layer.new_state(3, 10, dtype=torch.bfloat16)
    assert (state.C.shape, state.n.shape, state.m.shape) == ((3, H, 8, 16), (3, H, 8), (3, H))
    assert state.C.dtype == state.n.dtype == state.m.dtype == torch.float32


def test_configuration_errors_name_the_option_and_the_fix():
    with pytest.raises(ConfigError, match=r"mlstm: norm='groupnorm' is not one of layernorm, rmsnorm"):
        mixer(norm="groupnorm")
    with pytest.raises(ConfigError, match=r"mlstm: dim=32 must be divisible by 2·heads=6 .* or set head_dim"):
        seqzoo.registry().create("mixer", {"kind": "mlstm", "heads": 3}, C)
    assert seqzoo.registry().create("mixer", {"kind": "mlstm", "heads": 3, "head_dim": 4, "value_head_dim": 4}, C)
