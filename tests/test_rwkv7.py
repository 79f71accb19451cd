"""RWKV-7: the chunked DPLR form against the token-by-token recurrence (``seqzoo.reference.rwkv7``)
and against the plain delta rule written out here; the time mix and the channel mix against their
references with the authors' tensors copied in (``matches_reference``); the value residual across
layers, whole, in pieces and in segments; bfloat16; the recipe's layout; fla's kernels against the
plain path on CUDA. The recipe's decoding through its states is in test_recurrent_recipes.py."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import seqzoo
from seqzoo.errors import ConfigError
from seqzoo.interfaces import MixerContext
from seqzoo.plugins.mixer import _rwkv, _segments
from seqzoo.plugins.mixer._rwkv import dplr_step, wkv7
from seqzoo.plugins.mixer.rwkv7 import FIRST, fla_rank
from seqzoo.reference.rwkv7 import generalized_delta_rule, rwkv7_channel_mix, rwkv7_time_mix
from seqzoo.testing import (
    bfloat16_equivalence,
    gradients_match_reference,
    kernel_paths_agree,
    matches_reference,
    relative_difference,
    segments_equivalence,
)

C = 32


def recurrence_inputs(length: int, dtype=torch.float64, steep: float = 0.0, values: int = 4):
    """r, w (log-decay over RWKV-7's whole range; ``steep`` pushes it to the floor −e^{−½}), k, v,
    κ̂, a, S_0 for 2 rows of 3 heads, D_k = 6."""
    g = torch.Generator().manual_seed(1)
    randn = lambda *shape: torch.randn(*shape, generator=g, dtype=dtype)  # noqa: E731
    r, k, v = randn(2, length, 3, 6), randn(2, length, 3, 6), randn(2, length, 3, values)
    w = -math.exp(-0.5) * torch.sigmoid(randn(2, length, 3, 6) * 2 + steep)
    kappa = F.normalize(randn(2, length, 3, 6), dim=-1)
    return r, w, k, v, kappa, torch.sigmoid(randn(2, length, 3, 6)), randn(2, 3, 6, values)


def reference(r, w, k, v, kappa, a, state):
    return generalized_delta_rule(r, w.exp(), k, v, kappa, a, state=state)


# -- the recurrence ---------------------------------------------------------------------------------
@pytest.mark.parametrize("steep", [0.0, 10.0], ids=["mixed-decays", "steepest-decays"])
@pytest.mark.parametrize("values", [4, 9], ids=["D_v<D_k", "D_v>D_k"])
def test_chunked_form_equals_the_recurrence_in_float64(steep, values):
    """37 tokens (no multiple of any chunk), from a state, in chunks of 1 to 64 (longer than T)."""
    inputs = recurrence_inputs(37, steep=steep, values=values)
    expected, final = reference(*inputs)
    for chunk in (1, 8, 16, 32, 64):
        o, last = wkv7(*inputs, chunk)
        assert relative_difference((o, last), (expected, final)) < 1e-12, chunk


@pytest.mark.parametrize("steep", [0.0, 10.0], ids=["mixed-decays", "steepest-decays"])
def test_chunked_form_in_float32_stays_within_1e_5_of_the_float64_recurrence(steep):
    inputs = recurrence_inputs(100, steep=steep)
    expected, final = reference(*inputs)
    o, last = wkv7(*(t.float() for t in inputs), 32)
    assert o.dtype == last.dtype == torch.float32
    assert relative_difference((o, last), (expected, final)) < 1e-5


def test_float32_gradients_of_the_chunked_form_match_the_float64_recurrence():
    """Every input's gradient, the initial state's included, over 45 tokens in chunks of 16."""
    names = "r w k v kappa a state".split()
    gradients_match_reference(lambda t: wkv7(*t.values(), 16), lambda t: reference(*t.values()),
                              dict(zip(names, recurrence_inputs(45))))


def test_decode_steps_equal_the_chunked_form():
    r, w, k, v, kappa, a, h = recurrence_inputs(9)
    expected, final = wkv7(r, w, k, v, kappa, a, h, 4)
    for t in range(9):
        o, h = dplr_step(r[:, t], w[:, t], k[:, t], v[:, t], -kappa[:, t], kappa[:, t] * a[:, t], h)
        assert torch.allclose(o, expected[:, t], atol=1e-12)
    assert torch.allclose(h, final, atol=1e-12)


def test_neutral_steps_leave_the_state_unchanged():
    r, w, k, v, kappa, a, h = recurrence_inputs(6)
    w, k, kappa = w * 0, k * 0, kappa * 0  # what the mixer gives a padded position
    _, after = wkv7(r, w, k, v, kappa, a, h, 4)
    assert torch.equal(after, h)


@pytest.mark.parametrize("beta", [1.0, 0.3], ids=["a=1", "a=0.3"])
def test_with_no_decay_the_generalised_rule_is_the_delta_rule(beta):
    """w = 1, a = β, κ̂ = k unit and k̃ = β k: S_t = S_{t−1} + β k_t (v_t − S_{t−1}ᵀ k_t)ᵀ, the delta
    rule (Widrow & Hoff's online regression step), written out here on its own."""
    r, _, k, v, _, _, S = recurrence_inputs(29)
    k = F.normalize(k, dim=-1)
    expected, S_plain = [], S
    for t in range(29):
        read = torch.einsum("bhkv,bhk->bhv", S_plain, k[:, t])
        S_plain = S_plain + beta * k[:, t, ..., None] * (v[:, t] - read)[..., None, :]
        expected.append(torch.einsum("bhkv,bhk->bhv", S_plain, r[:, t]))
    expected = torch.stack(expected, 1)
    for dtype, tolerance in ((torch.float64, 1e-12), (torch.float32, 1e-5)):
        o, final = wkv7(r.to(dtype), torch.zeros_like(k, dtype=dtype), (beta * k).to(dtype), v.to(dtype),
                        k.to(dtype), torch.full_like(k, beta, dtype=dtype), S.to(dtype), 8)
        assert relative_difference((o, final), (expected, S_plain)) < tolerance


# -- the mixers against the layers written token by token ------------------------------------------
def mixer(**options) -> torch.nn.Module:
    spec = {"kind": "rwkv7", "head_dim": 8, "decay_rank": 4, "a_rank": 5, "value_rank": 3, "gate_rank": 6,
            "chunk": 4, **options}
    return seqzoo.registry().create("mixer", spec, C).eval()


def authors_tensors(m) -> dict[str, torch.Tensor]:
    """Our parameters under RWKV-LM's names and layouts (docs/formulas.md §15.7's mapping)."""
    out = {f"x_{n}": m.x_mix[i] for i, n in enumerate("rwkvag")}
    for ours, theirs in (("w_lora", "w"), ("a_lora", "a"), ("v_lora", "v")):
        if hasattr(m, ours):
            lora = getattr(m, ours)
            out.update({f"{theirs}0": lora[2].bias, f"{theirs}1": lora[0].weight.T, f"{theirs}2": lora[2].weight.T})
    out.update({"g1": m.g_lora[0].weight.T, "g2": m.g_lora[2].weight.T, "k_k": m.k_k, "k_a": m.k_a, "r_k": m.r_k,
                "receptance.weight": m.r_proj.weight, "key.weight": m.k_proj.weight,
                "value.weight": m.v_proj.weight, "output.weight": m.out_proj.weight,
                "ln_x.weight": m.g_norm.weight, "ln_x.bias": m.g_norm.bias})
    return out


def through_time_mix(m, x, run):
    return run(x, authors_tensors(m), m.heads, eps=m.g_norm.eps)[0][0]


@pytest.mark.parametrize("options", [{}, {"value_head_dim": 6}, {"value_residual": False, "norm_eps": 1e-3}],
                         ids=["default", "values-6-wide", "no-value-residual"])
def test_the_time_mix_matches_the_authors_layer_token_by_token(options):
    """The whole forward (11 tokens, chunks of 4) and decoding through the state, in float64."""
    matches_reference(mixer(**options), rwkv7_time_mix, through_time_mix)


def test_the_channel_mix_matches_the_authors_block_token_by_token():
    channel = seqzoo.registry().create("mixer", {"kind": "rwkv_channel_mix", "hidden": 40}, C)
    matches_reference(channel, rwkv7_channel_mix, lambda m, x, run: run(x, m.x_k, m.up.weight, m.down.weight)[0])


def context(length: int, padding: torch.Tensor | None = None, start: int = 0) -> MixerContext:
    """A fresh context, as the stack builds one per forward (its ``shared`` dict included)."""
    t = torch.arange(start, start + length)[None]
    return MixerContext(position=None, q_pos=t, k_pos=t, mask=None, causal=True, prepared={}, padding=padding)


def two_layers():
    first, second = mixer(chunk=8).double(), mixer(chunk=8).double()
    with torch.no_grad():
        for p in [*first.parameters(), *second.parameters()]:
            p.add_(torch.randn_like(p) * 0.1)
    return first, second


def test_later_layers_mix_in_the_first_layers_values_whole_in_pieces_and_in_segments(monkeypatch):
    """Two layers in one forward: the second mixes the first's values in (the reference is given
    them as v_first), through the whole sequence, 3 tokens and then one at a time through the
    states, in segments of 8 without autograd, and longer than a segment with autograd (one pass)."""
    first, second = two_layers()
    x1, x2 = torch.randn(2, 21, C, dtype=torch.float64), torch.randn(2, 21, C, dtype=torch.float64)
    (_, v), _ = rwkv7_time_mix(x1, authors_tensors(first), first.heads, eps=first.g_norm.eps)
    expected = rwkv7_time_mix(x2, authors_tensors(second), second.heads, v_first=v, eps=second.g_norm.eps)[0][0]
    alone = rwkv7_time_mix(x2, authors_tensors(second), second.heads, eps=second.g_norm.eps)[0][0]
    assert relative_difference(alone, expected) > 1e-3  # the residual changes the output

    def run(pieces):
        states, outs = (first.new_state(2, 21), second.new_state(2, 21)), []
        for start, end in pieces:
            shared = context(end - start, start=start)
            first(x1[:, start:end], shared, states[0])
            outs.append(second(x2[:, start:end], shared, states[1]))
            assert shared.shared[FIRST].shape == (2, end - start, C)
        return torch.cat(outs, 1)

    with torch.no_grad():
        assert relative_difference(run([(0, 21)]), expected) < 1e-12
        assert relative_difference(run([(0, 3), *((t, t + 1) for t in range(3, 21))]), expected) < 1e-12
        monkeypatch.setattr(_segments, "SEGMENT", 8)
        assert relative_difference(run([(0, 21)]), expected) < 1e-12
    assert relative_difference(run([(0, 21)]), expected) < 1e-12  # longer than a segment, with autograd: whole


def test_left_padding_leaves_the_state_and_the_value_residual_as_for_the_row_alone():
    first, second = two_layers()
    x1, x2 = torch.randn(2, 12, C, dtype=torch.float64), torch.randn(2, 12, C, dtype=torch.float64)
    padding = torch.ones(2, 12, dtype=torch.long)
    padding[1, :5] = 0
    with torch.no_grad():
        shared, states = context(12, padding), (first.new_state(2, 12), second.new_state(2, 12))
        first(x1, shared, states[0])
        padded = second(x2, shared, states[1])[1, 5:]
        alone_shared, alone_states = context(7), (first.new_state(1, 7), second.new_state(1, 7))
        first(x1[1:, 5:], alone_shared, alone_states[0])
        alone = second(x2[1:, 5:], alone_shared, alone_states[1])[0]
    assert relative_difference(padded, alone) < 1e-12
    for padded_state, alone_state in zip(states, alone_states):
        for name, value in vars(alone_state).items():
            assert torch.allclose(getattr(padded_state, name)[1:], value, atol=1e-12), name


def test_the_channel_mix_runs_long_inputs_in_segments_equal_to_the_whole(monkeypatch):
    """Segments of 8 over 30 tokens, a left-padded row, a state that continues: the outputs within
    1e-6, the token shift exactly."""
    channel = seqzoo.registry().create("mixer", {"kind": "rwkv_channel_mix", "hidden": 40}, C)
    monkeypatch.setattr(_segments, "SEGMENT", 8)
    segments_equivalence(channel, length=30, pad=11, atol=1e-6, state_atol=0.0, state_rtol=0.0)


def test_the_first_layers_residual_parameters_take_part_with_a_zero_gradient():
    """A layer alone is the first: it mixes its values with themselves, so v_lora is in the graph
    (DistributedDataParallel requires every parameter to be) and its gradient is exactly zero."""
    layer = mixer()
    layer(torch.randn(2, 7, C), context(7)).square().sum().backward()
    for p in layer.v_lora.parameters():
        assert p.grad is not None and torch.equal(p.grad, torch.zeros_like(p))
    assert layer.k_proj.weight.grad.abs().max() > 0


def test_bfloat16_inputs_run_with_float32_statistics_and_state():
    """The token shift holds inputs: bfloat16 in a bfloat16 layer; S float32; within 3%, and so under
    autocast (the recurrence runs in float32 there: its triangular solve has no bfloat16 kernel on
    the CPU)."""
    bfloat16_equivalence(mixer(chunk=8), inputs=("shift",), length=30, tolerance=3e-2)


# -- parameters, options and errors -----------------------------------------------------------------
def test_the_parameters_follow_fla_and_the_authors():
    layer = seqzoo.registry().create("mixer", {"kind": "rwkv7"}, 256)
    assert layer.heads == 4 and layer.r_k.shape == (4, 64) and layer.x_mix.shape == (6, 256)
    assert layer.w_lora[0].weight.shape == (32, 256) and layer.g_lora[2].weight.shape == (256, 64)
    assert layer.g_lora[2].bias is None and layer.g_norm.eps == pytest.approx(64e-5)
    assert (fla_rank(2048, 2.5), fla_rank(2048, 1.7), fla_rank(2048, 5.0)) == (128, 64, 224)
    w = -math.exp(-0.5) * torch.sigmoid(layer.w_lora[2].bias)
    assert w.min() > -math.exp(-0.5) and w.max() < 0  # every channel decays, none past the floor
    names = {name for name, _ in layer.named_parameters()}
    assert set(layer.no_weight_decay) | set(layer.keep_init) <= names
    plain = seqzoo.registry().create("mixer", {"kind": "rwkv7", "value_residual": False}, 256)
    assert not any(name.startswith("v_lora") for name, _ in plain.named_parameters())
    channel = seqzoo.registry().create("mixer", {"kind": "rwkv_channel_mix"}, 100)
    assert channel.up.weight.shape == (416, 100)  # 4·C rounded up to a multiple of 32, as fla


def test_configuration_errors_name_the_option_and_the_fix():
    with pytest.raises(ConfigError, match=r"rwkv7: dim=32 must be divisible by head_dim=12"):
        mixer(head_dim=12)


# -- the recipe -------------------------------------------------------------------------------------
def test_the_recipe_alternates_time_and_channel_mix_each_with_its_state():
    model = seqzoo.build("tiny-rwkv7", device="cpu")
    kinds = [type(b.mixer).__name__ for b in model.decoder.blocks]
    assert kinds == ["RWKV7", "RWKVChannelMix"] * 4 and all(b.ffn is None for b in model.decoder.blocks)
    cache = model.new_cache(1, 16)
    assert cache.states[0].S.shape == (1, 4, 16, 16) and cache.states[1].shift.shape == (1, 64)


# -- fla's Triton kernels on CUDA against the plain path --------------------------------------------
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_on_cuda_fla_kernels_equal_the_torch_path(dtype):
    """Forward, every gradient and the decode steps: fla's chunk_rwkv7 and fused-recurrent kernels
    against the chunked form of ``_rwkv`` (SEQZOO_SCAN=torch), on the same mixer."""
    pytest.importorskip("fla")
    assert _rwkv._fla_kernels() is not None
    layer = seqzoo.registry().create("mixer", {"kind": "rwkv7", "head_dim": 64}, 128).cuda().to(dtype)
    x = torch.randn(2, 300, 128, device="cuda", dtype=dtype)
    kernel_paths_agree(layer, x, tolerance=2e-3 if dtype == torch.float32 else 3e-2)
