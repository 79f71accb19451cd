"""Griffin's RG-LRU block: the diagonal scan against the token-by-token recurrence
(``seqzoo.reference.rg_lru``), the mixer against transformers' ``RecurrentGemmaRecurrentBlock`` with
its weights copied in (whole sequences and cached decoding) and against the layer written out by
hand (``matches_reference``), its parameters and its reset at each row's first real token. What it
shares with the other recurrent mixers as a layer (state size, segments, dtypes, fla on CUDA) is in
test_recurrent_mixers.py, the recipe (tiny-griffin) in test_recurrent_recipes.py."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import seqzoo
from seqzoo.errors import ConfigError
from seqzoo.plugins.mixer import _diagonal_scan
from seqzoo.plugins.mixer._diagonal_scan import chunked_scan, diagonal_scan, step
from seqzoo.plugins.mixer._selective_scan import LOG_DECAY_LIMIT
from seqzoo.plugins.mixer.rg_lru import MAX_SQRT_GRADIENT, _BoundedSqrt
from seqzoo.reference.rg_lru import rg_lru
from seqzoo.testing import gradients_match_reference, matches_reference, relative_difference
from seqzoo.testing.mixer import _context, _full, _pieces

C, W, H = 16, 24, 4  # an LRU wider than the model, in four gate blocks of 6


def recurrence_inputs(length: int, dtype=torch.float64, steep: float = 0.0, batch: int = 2):
    """x, i, r (B, T, W), Λ (W,), h_0 (B, W); ``steep`` > 0 makes softplus(Λ) large (a → 0)."""
    gen = torch.Generator().manual_seed(3)
    randn = lambda *shape: torch.randn(*shape, generator=gen, dtype=dtype)  # noqa: E731
    x, i, r = randn(batch, length, W), torch.sigmoid(randn(batch, length, W)), torch.sigmoid(randn(batch, length, W))
    lam = randn(W) + steep
    return x, i, r, lam, randn(batch, W)


def scan_inputs(x, i, r, lam, c=8.0):
    """docs/formulas.md §15.10: g = log a = −c·r·softplus(Λ), b = √(1 − a²) ⊙ i ⊙ x."""
    g = -c * r * F.softplus(lam)
    return g, torch.sqrt(1 - torch.exp(2 * g)) * i * x


@pytest.mark.parametrize("steep", [0.0, 6.0])  # long chunks; chunks cut short by the e^−40 limit
@pytest.mark.parametrize("chunk", [1, 8, 64])
def test_chunked_scan_equals_the_recurrence_in_float64(steep, chunk):
    x, i, r, lam, h0 = recurrence_inputs(45, steep=steep)  # 45: not a multiple of 8 or 64
    expected = rg_lru(x, i, r, lam, state=h0)
    assert relative_difference(chunked_scan(*scan_inputs(x, i, r, lam), h0, chunk), expected) <= 1e-12


def test_steep_decays_shorten_the_chunks_to_the_log_decay_limit(monkeypatch):
    x, i, r, lam, h0 = recurrence_inputs(64, steep=6.0)  # Σ|g| over 64 tokens ≫ 40
    g, b = scan_inputs(x, i, r, lam)
    assert g.sum(1).abs().max() > LOG_DECAY_LIMIT
    lengths = []
    original = _diagonal_scan.chunk_length
    monkeypatch.setattr(_diagonal_scan, "chunk_length", lambda *a: lengths.append(original(*a)) or lengths[-1])
    chunked_scan(g, b, h0, 64)
    assert 1 <= lengths[0] < 64


@pytest.mark.parametrize("steep", [0.0, 6.0])
def test_chunked_scan_in_float32_stays_within_1e_5_of_the_float64_recurrence(steep):
    x, i, r, lam, h0 = recurrence_inputs(300, steep=steep)
    expected, final = rg_lru(x, i, r, lam, state=h0)
    out, last = chunked_scan(*(t.float() for t in scan_inputs(x, i, r, lam)), h0.float(), 64)
    assert out.dtype == torch.float32
    assert relative_difference((out, last), (expected, final)) <= 1e-5


def test_float32_gradients_of_the_chunked_scan_match_the_float64_recurrence():
    """Every input's gradient (x, i, r, Λ, h_0), float32 chunks of 8 over 45 tokens."""
    names = ("x", "i", "r", "lam", "h0")
    gradients_match_reference(
        lambda t: chunked_scan(*scan_inputs(t["x"], t["i"], t["r"], t["lam"]), t["h0"], 8),
        lambda t: rg_lru(t["x"], t["i"], t["r"], t["lam"], state=t["h0"]), dict(zip(names, recurrence_inputs(45))))


def test_decode_steps_equal_the_recurrence_and_neutral_steps_change_nothing():
    x, i, r, lam, h = recurrence_inputs(9)
    expected, _ = rg_lru(x, i, r, lam, state=h)
    g, b = scan_inputs(x, i, r, lam)
    for t in range(9):
        h = step(g[:, t], b[:, t], h)
        assert torch.allclose(h, expected[:, t], atol=1e-12)
    zeros = torch.zeros(2, 5, W, dtype=torch.float64)
    assert torch.equal(chunked_scan(zeros, zeros, h)[1], h)
    assert torch.equal(diagonal_scan(zeros[:, :1], zeros[:, :1], h, 64)[1], h)


def test_a_reset_starts_afresh_with_the_input_unscaled():
    x, i, r, lam, h0 = recurrence_inputs(4)
    reset = torch.tensor([[True, False, False, False], [False, False, True, False]])
    out, _ = rg_lru(x, i, r, lam, reset=reset, state=h0)
    assert torch.allclose(out[0, 0], i[0, 0] * x[0, 0]) and torch.allclose(out[1, 2], i[1, 2] * x[1, 2])
    assert torch.allclose(rg_lru(x[1:, 2:], i[1:, 2:], r[1:, 2:], lam, reset=reset[1:, 2:])[0], out[1:, 2:])


def test_the_square_roots_gradient_is_capped_as_recurrentgemmas():
    recurrent_gemma = pytest.importorskip("transformers.models.recurrent_gemma.modeling_recurrent_gemma")
    x = torch.tensor([0.0, 1e-9, 1e-4, 0.25, 1.0], requires_grad=True)
    y = x.detach().clone().requires_grad_()
    _BoundedSqrt.apply(x).sum().backward()
    recurrent_gemma.SqrtBoundDerivative.apply(y).sum().backward()
    assert torch.equal(x.grad, y.grad) and torch.isclose(x.grad.max(), torch.tensor(MAX_SQRT_GRADIENT))


# -- the mixer --------------------------------------------------------------------------------------
def mixer(**options) -> torch.nn.Module:
    return seqzoo.registry().create("mixer", {"kind": "rg_lru", "heads": H, "width": W, "chunk": 8, **options},
                                    C).eval()


def recurrent_gemma_block():
    """transformers' block and ours with its weights (docs/formulas.md §15.10's mapping)."""
    recurrent_gemma = pytest.importorskip("transformers.models.recurrent_gemma.modeling_recurrent_gemma")
    from transformers.models.recurrent_gemma.configuration_recurrent_gemma import RecurrentGemmaConfig
    config = RecurrentGemmaConfig(hidden_size=C, lru_width=W, num_attention_heads=H, num_hidden_layers=3,
                                  intermediate_size=32, vocab_size=50)
    hf = recurrent_gemma.RecurrentGemmaRecurrentBlock(config, 0).eval()
    ours = mixer()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, 0.3)
        ours.in_proj.weight.copy_(torch.cat([hf.linear_x.weight, hf.linear_y.weight]))
        ours.in_proj.bias.copy_(torch.cat([hf.linear_x.bias, hf.linear_y.bias]))
        ours.conv1d.load_state_dict(hf.conv_1d.state_dict())
        ours.out_proj.load_state_dict(hf.linear_out.state_dict())
        for name, value in hf.rg_lru.named_parameters():
            getattr(ours, name).copy_(value)
    return hf, ours


def test_the_mixer_equals_recurrentgemmas_recurrent_block_with_its_weights():
    """21 tokens in chunks of 8, float32, from position 0 (transformers' reset)."""
    hf, ours = recurrent_gemma_block()
    x = torch.randn(2, 21, C)
    with torch.no_grad():
        expected, _ = hf(x, torch.arange(21)[None], None, use_cache=False)
        assert (_full(ours, x) - expected).abs().max() <= 1e-5 * expected.abs().max()


def test_cached_decoding_equals_recurrentgemmas_cached_decoding():
    """A 13-token prefill, then one token at a time, through both blocks' caches."""
    hf, ours = recurrent_gemma_block()
    x = torch.randn(2, 20, C)
    with torch.no_grad():
        hf._setup_cache(2, "cpu", torch.float32)
        expected = [hf(x[:, :13], torch.arange(13)[None], None, use_cache=True)[0]]
        expected += [hf(x[:, t:t + 1], torch.tensor([[t]]), None, use_cache=True)[0] for t in range(13, 20)]
        expected = torch.cat(expected, 1)
        state = ours.new_state(2, 20)
        got = torch.cat([ours(x[:, :13], _context(torch.arange(13)[None]), state)]
                        + [ours(x[:, t:t + 1], _context(torch.tensor([[t]])), state) for t in range(13, 20)], 1)
    assert (got - expected).abs().max() <= 1e-5 * expected.abs().max()
    assert (state.h - hf.rg_lru.recurrent_states).abs().max() <= 1e-5 * state.h.abs().max()


def through_rg_lru(m, x, run):
    """docs/formulas.md §15.10 in float64: in_proj [u | y], the causal conv with its bias, the
    block-diagonal gates, the RG-LRU with its reset at the first token, h ⊙ GeLU_tanh(y), out_proj."""
    u, y = m.in_proj(x).chunk(2, -1)
    u = m.conv1d(F.pad(u.transpose(1, 2), (m.kernel - 1, 0))).transpose(1, 2)
    blocks = u.unflatten(-1, (m.heads, -1))
    gate = lambda w, b: torch.sigmoid(torch.einsum("bthi,hio->btho", blocks, w) + b).flatten(2)  # noqa: E731
    reset = torch.zeros(x.shape[:2], dtype=torch.bool)
    reset[:, 0] = True
    h, _ = run(u, gate(m.input_gate_weight, m.input_gate_bias), gate(m.recurrent_gate_weight, m.recurrent_gate_bias),
               m.recurrent_param, c=m.c, reset=reset)
    return m.out_proj(h * F.gelu(y, approximate="tanh"))


@pytest.mark.parametrize("options", [{}, {"width": None, "heads": 2, "conv_bias": False, "bias": False, "c": 4.0}],
                         ids=["recurrentgemma", "narrow-no-biases"])
def test_the_mixer_matches_the_rg_lru_recurrence(options):
    matches_reference(mixer(**options), rg_lru, through_rg_lru, length=21)


def test_the_parameters_follow_recurrentgemma():
    layer = mixer()
    shapes = {name: tuple(p.shape) for name, p in layer.named_parameters()}
    assert shapes == {"in_proj.weight": (2 * W, C), "in_proj.bias": (2 * W,), "conv1d.weight": (W, 1, 4),
                      "conv1d.bias": (W,), "input_gate_weight": (H, 6, 6), "input_gate_bias": (H, 6),
                      "recurrent_gate_weight": (H, 6, 6), "recurrent_gate_bias": (H, 6),
                      "recurrent_param": (W,), "out_proj.weight": (C, W), "out_proj.bias": (C,)}
    a = torch.exp(-F.softplus(layer.recurrent_param))  # a at c·r = 1
    assert 0.9 - 1e-6 <= a.min() and a.max() <= 0.999 + 1e-6
    assert layer.no_weight_decay == ("recurrent_param",) and layer.residual_projections == ("out_proj",)


def test_a_width_that_does_not_split_into_the_gate_blocks_is_refused():
    with pytest.raises(ConfigError, match=r"rg_lru: width=24 must be divisible by heads=5"):
        mixer(heads=5)


def test_a_left_padded_row_resets_at_its_first_real_token_whole_and_in_pieces():
    layer = mixer()
    x = torch.randn(2, 9, C)
    padding = torch.ones(2, 9, dtype=torch.long)
    padding[1, :4] = 0
    with torch.no_grad():
        alone = _full(layer, x[1:, 4:])[0]
        assert (_full(layer, x, padding)[1, 4:] - alone).abs().max() < 1e-6
        assert (_pieces(layer, x, padding)[0][1, 4:] - alone).abs().max() < 1e-6


def test_the_reference_continued_from_its_state_equals_the_whole():
    x, i, r, lam, h0 = recurrence_inputs(10)
    whole, last = rg_lru(x, i, r, lam, state=h0)
    first, h = rg_lru(x[:, :4], i[:, :4], r[:, :4], lam, state=h0)
    rest, end = rg_lru(x[:, 4:], i[:, 4:], r[:, 4:], lam, state=h)
    assert torch.allclose(torch.cat([first, rest], 1), whole) and torch.allclose(end, last)
