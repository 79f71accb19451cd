"""LFM2's gated short conv: the mixer against transformers' ``Lfm2ShortConv`` with its weights
copied in (whole sequences and cached decoding through transformers' own cache), against the
layer written out by hand over ``seqzoo.reference.short_conv`` (``matches_reference``), and its
parameters. What it shares with the other recurrent mixers as a layer (state size, segments,
dtypes, fla on CUDA) is in test_recurrent_mixers.py, the recipe (tiny-lfm2) in
test_recurrent_recipes.py."""
from __future__ import annotations

import pytest
import torch

import seqzoo
from seqzoo.reference.short_conv import gated_short_conv
from seqzoo.testing import matches_reference
from seqzoo.testing.mixer import _context, _full

C = 16


def mixer(**options) -> torch.nn.Module:
    return seqzoo.registry().create("mixer", {"kind": "short_conv", **options}, C).eval()


def lfm2_layer(conv_bias: bool, kernel: int = 3):
    """transformers' layer and ours with its weights (docs/formulas.md §15.9's mapping: the
    same names, ``conv`` -> ``conv1d``); LFM2's one ``conv_bias`` switches all three biases."""
    lfm2 = pytest.importorskip("transformers.models.lfm2.modeling_lfm2")
    from transformers.models.lfm2.configuration_lfm2 import Lfm2Config
    config = Lfm2Config(hidden_size=C, num_hidden_layers=2, layer_types=["conv", "full_attention"],
                        num_attention_heads=2, num_key_value_heads=1, intermediate_size=32, vocab_size=50,
                        conv_bias=conv_bias, conv_L_cache=kernel)
    hf = lfm2.Lfm2ShortConv(config, 0).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, 0.3)
    ours = mixer(conv=kernel, conv_bias=conv_bias, bias=conv_bias)
    ours.load_state_dict({name.replace("conv.", "conv1d.", 1) if name.startswith("conv.") else name: value
                          for name, value in hf.state_dict().items()})
    return hf, ours, config


@pytest.mark.parametrize(("conv_bias", "kernel"), [(False, 3), (True, 4)], ids=["lfm2", "biases-kernel-4"])
def test_the_mixer_equals_lfm2s_short_conv_with_its_weights(conv_bias, kernel):
    hf, ours, _ = lfm2_layer(conv_bias, kernel)
    x = torch.randn(2, 21, C)
    with torch.no_grad():
        expected = hf(x)
        assert (_full(ours, x) - expected).abs().max() <= 1e-5 * expected.abs().max()


def test_cached_decoding_equals_lfm2s_cached_decoding():
    """A 13-token prefill, then one token at a time: transformers' layer through its DynamicCache,
    ours through its state; the conv histories agree too (transformers keeps K inputs, we K − 1)."""
    from transformers.cache_utils import DynamicCache
    hf, ours, config = lfm2_layer(False)
    x = torch.randn(2, 20, C)
    with torch.no_grad():
        cache = DynamicCache(config=config)
        expected = torch.cat([hf(x[:, :13], cache=cache)] + [hf(x[:, t:t + 1], cache=cache) for t in range(13, 20)], 1)
        state = ours.new_state(2, 20)
        got = torch.cat([ours(x[:, :13], _context(torch.arange(13)[None]), state)]
                        + [ours(x[:, t:t + 1], _context(torch.tensor([[t]])), state) for t in range(13, 20)], 1)
    assert (got - expected).abs().max() <= 1e-5 * expected.abs().max()
    assert torch.allclose(state.conv, cache.layers[0].conv_states[0][..., 1:], atol=1e-6)


def through_short_conv(m, x, run):
    """docs/formulas.md §15.9 in float64: in_proj split [B | C | x], the gated conv
    token by token, out_proj."""
    b, c, u = m.in_proj(x).chunk(3, -1)
    y, _ = run(b, c, u, m.conv1d.weight[:, 0], m.conv1d.bias)
    return m.out_proj(y)


@pytest.mark.parametrize("options", [{}, {"conv": 5, "conv_bias": True, "bias": True}], ids=["lfm2", "biases"])
def test_the_mixer_matches_the_gated_conv_token_by_token(options):
    matches_reference(mixer(**options), gated_short_conv, through_short_conv)


def test_the_parameters_follow_lfm2():
    layer = mixer()
    shapes = {name: tuple(p.shape) for name, p in layer.named_parameters()}
    assert shapes == {"in_proj.weight": (3 * C, C), "conv1d.weight": (C, 1, 3), "out_proj.weight": (C, C)}
    assert layer.residual_projections == ("out_proj",) and layer.causal_only


def test_the_reference_continued_from_its_history_equals_the_whole():
    b, c, x = torch.randn(3, 2, 10, C, dtype=torch.float64)
    weight, bias = torch.randn(C, 4, dtype=torch.float64), torch.randn(C, dtype=torch.float64)
    whole, last = gated_short_conv(b, c, x, weight, bias)
    first, history = gated_short_conv(b[:, :4], c[:, :4], x[:, :4], weight, bias)
    rest, end = gated_short_conv(b[:, 4:], c[:, 4:], x[:, 4:], weight, bias, state=history)
    assert torch.allclose(torch.cat([first, rest], 1), whole) and torch.equal(end, last)
    assert history.shape == (2, C, 3)
