"""RWKV-4: the parallel scan of the WKV (``_wkv4``) against the token-by-token recurrence
(``seqzoo.reference.rwkv4``) and transformers' ``rwkv_linear_attention_cpu``; the time mix
(``rwkv4``) and the channel mix (``rwkv_channel_mix`` with ``receptance: true``) against
transformers' ``RwkvSelfAttention`` and ``RwkvFeedForward`` with their weights copied in, and against
the references (``matches_reference``); padding, segments, bfloat16; the tiny-rwkv4 recipe's decoding
through its states; fla's kernel against the plain path on CUDA."""
from __future__ import annotations

import pytest
import torch

import seqzoo
from seqzoo.errors import ConfigError
from seqzoo.interfaces import MixerContext
from seqzoo.plugins.mixer import _segments, _wkv4
from seqzoo.plugins.mixer._wkv4 import EMPTY, wkv4, wkv_step
from seqzoo.reference.rwkv4 import rwkv4_channel_mix, rwkv4_time_mix
from seqzoo.reference.rwkv4 import wkv4 as recurrence
from seqzoo.testing import (
    beam_search_equivalence,
    bfloat16_equivalence,
    gradients_match_reference,
    kernel_paths_agree,
    kv_cache_equivalence,
    left_padding_equivalence,
    matches_reference,
    relative_difference,
    segments_equivalence,
    static_cache_equivalence,
)

transformers = pytest.importorskip("transformers")
modeling_rwkv = pytest.importorskip("transformers.models.rwkv.modeling_rwkv")

C = 32


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def wkv_inputs(length: int, *, width: int = 6, dtype=torch.float64, decays: float = 2.0, keys: float = 1.0):
    """time_decay, time_first, k, v and a state (num, den, max) for 2 rows of ``width`` channels:
    time_decay ~ N(0, ``decays``²) (w = −e^{time_decay}: from ~1 to e^{±6} per step at 3σ), keys
    ~ N(0, ``keys``²)."""
    g = torch.Generator().manual_seed(1)
    randn = lambda *shape: torch.randn(*shape, generator=g, dtype=dtype)  # noqa: E731
    state = (randn(2, width), torch.rand(2, width, generator=g, dtype=dtype) + 0.5, randn(2, width))
    return randn(width) * decays, randn(width), randn(2, length, width) * keys, randn(2, length, width), state


# -- the recurrence ---------------------------------------------------------------------------------
@pytest.mark.parametrize("with_state", [False, True], ids=["empty-state", "given-state"])
@pytest.mark.parametrize("decays", [0.5, 3.0], ids=["slow-decays", "fast-decays"])
def test_parallel_scan_equals_the_recurrence_in_float64(with_state, decays):
    """37 tokens (no multiple of any chunk) in chunks of 1 to 64 (longer than T)."""
    time_decay, time_first, k, v, state = wkv_inputs(37, decays=decays, keys=3.0)
    state = state if with_state else None
    expected = recurrence(time_decay, time_first, k, v, state=state)
    for chunk in (1, 2, 8, 16, 32, 64):
        assert relative_difference(wkv4(time_decay, time_first, k, v, state, chunk), expected) < 1e-12, chunk


def test_parallel_scan_in_float32_stays_within_1e_5_of_the_float64_recurrence():
    time_decay, time_first, k, v, state = wkv_inputs(100)
    expected = recurrence(time_decay, time_first, k, v, state=state)
    got = wkv4(*(t.float() for t in (time_decay, time_first, k, v)), tuple(t.float() for t in state), 32)
    assert all(t.dtype == torch.float32 for t in (got[0], *got[1]))
    assert relative_difference(got, expected) < 1e-5


def test_keys_whose_exponentials_overflow_float32_give_the_recurrences_outputs():
    """Keys up to ±150 (e^150 is past float32's 3.4e38; neighbours jump by more than e^88, where a
    scale per chunk would lose the smaller) and decays of up to e^6 ≈ 400 per step: the scan stays
    finite and within 1e-4 of the float64 recurrence on the same float32 inputs (an exponent of
    ~150 carries float32's rounding of 1e-5 relative)."""
    inputs = [t.float().double() for t in wkv_inputs(64, decays=3.0, keys=50.0)[:4]]
    expected, _ = recurrence(*inputs)
    got, final = wkv4(*(t.float() for t in inputs), None, 16)
    assert inputs[2].abs().max() > 120 and torch.isfinite(got).all() and all(torch.isfinite(t).all() for t in final)
    assert relative_difference(got, expected) < 1e-4


def test_float32_gradients_of_the_parallel_scan_match_the_float64_recurrence():
    """Every input's gradient (the state's three included) over 45 tokens in chunks of 16."""
    names = "time_decay time_first k v state".split()
    gradients_match_reference(lambda t: wkv4(*t.values(), 16),
                              lambda t: recurrence(*list(t.values())[:4], state=t["state"]),
                              dict(zip(names, wkv_inputs(45, keys=2.0))))


def test_parallel_scan_equals_transformers_rwkv_linear_attention_cpu():
    """transformers' own CPU recurrence, called on float32 inputs from a state: the outputs within
    1e-5 and the state (num, den, max) it returns."""
    time_decay, time_first, k, v, state = (t.float() if torch.is_tensor(t) else tuple(s.float() for s in t)
                                           for t in wkv_inputs(50))
    theirs, their_state = modeling_rwkv.rwkv_linear_attention_cpu(time_decay, time_first, k, v,
                                                                  state=[s.clone() for s in state], return_state=True)
    ours, our_state = wkv4(time_decay, time_first, k, v, state, 16)
    assert relative_difference(ours, theirs) < 1e-5
    assert relative_difference(our_state, tuple(their_state)) < 1e-5


def test_decode_steps_equal_the_parallel_scan():
    time_decay, time_first, k, v, state = wkv_inputs(9)
    expected, final = wkv4(time_decay, time_first, k, v, state, 4)
    w = -time_decay.exp()
    for t in range(9):
        out, state = wkv_step(w, time_first, k[:, t], v[:, t], state)
        assert torch.allclose(out, expected[:, t], atol=1e-12)
    assert relative_difference(state, final) < 1e-12


def test_padded_positions_leave_the_state_as_it_was():
    time_decay, time_first, k, v, state = wkv_inputs(6)
    _, after = wkv4(time_decay, time_first, k, v, state, 4, real=torch.zeros(2, 6, 1, dtype=k.dtype))
    assert all(torch.equal(a, b) for a, b in zip(after, state))


# -- the mixers against transformers' modules and the references ----------------------------------
def mixer(**options) -> torch.nn.Module:
    layer = seqzoo.registry().create("mixer", {"kind": "rwkv4", "chunk": 8, **options}, C).eval()
    with torch.no_grad():  # away from the start, where the token-shift weights are a plain ramp
        for p in layer.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return layer


def channel_mix(hidden: int = 40) -> torch.nn.Module:
    layer = seqzoo.registry().create("mixer", {"kind": "rwkv_channel_mix", "hidden": hidden, "receptance": True},
                                     C).eval()
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return layer


def time_mix_tensors(m) -> dict[str, torch.Tensor]:
    """Our time mix under transformers' names (``RwkvSelfAttention``; the token-shift mixes as (C,))."""
    mix = dict(zip(("time_mix_key", "time_mix_value", "time_mix_receptance"), m.time_mix))
    return {"time_decay": m.time_decay, "time_first": m.time_first, **mix, "key.weight": m.k_proj.weight,
            "value.weight": m.v_proj.weight, "receptance.weight": m.r_proj.weight, "output.weight": m.out_proj.weight}


def channel_mix_tensors(m) -> dict[str, torch.Tensor]:
    """Our channel mix under transformers' names (``RwkvFeedForward``): μ = 1 − x_k, 1 − x_r."""
    return {"time_mix_key": 1 - m.x_k, "time_mix_receptance": 1 - m.x_r, "key.weight": m.up.weight,
            "value.weight": m.down.weight, "receptance.weight": m.receptance.weight}


def config(width: int | None = None, hidden: int = 40):
    return transformers.RwkvConfig(hidden_size=C, attention_hidden_size=width, intermediate_size=hidden,
                                   num_hidden_layers=1, vocab_size=16)


def their_layer(cls, tensors: dict[str, torch.Tensor], cfg) -> torch.nn.Module:
    layer = cls(cfg, layer_id=0).eval()
    with torch.no_grad():
        for name, value in tensors.items():
            target = layer.get_parameter(name)
            target.copy_(value.reshape(target.shape))
    return layer


def context(length: int, padding: torch.Tensor | None = None) -> MixerContext:
    t = torch.arange(length)[None]
    return MixerContext(position=None, q_pos=t, k_pos=t, mask=None, causal=True, prepared={}, padding=padding)


def their_state(batch: int, width: int) -> list[torch.Tensor]:
    """transformers' empty RWKV state for one layer: 5 (B, width, 1) tensors, max at −1e30."""
    state = [torch.zeros(batch, width, 1) for _ in range(5)]
    state[4] -= 1e30
    return state


@pytest.mark.parametrize("width", [None, 24], ids=["A=C", "A=24"])
def test_the_time_mix_equals_transformers_rwkv_self_attention(width):
    """transformers' layer with our weights copied in: 23 tokens within 1e-5 (chunks of 8)."""
    ours = mixer(width=width)
    theirs = their_layer(modeling_rwkv.RwkvSelfAttention, time_mix_tensors(ours), config(width))
    x = torch.randn(2, 23, C)
    with torch.no_grad():
        assert relative_difference(ours(x, context(23)), theirs(x)[0]) < 1e-5


def test_the_time_mix_continues_from_its_state_as_transformers_does_from_its_own():
    """13 tokens, then 6 more and then one from the states: the outputs and the states (the shift,
    num, den, max) within 1e-5 of transformers' cached layer. One row: transformers 5's layer mixes
    the rows of a batch in a one-token step (its (B, 1, C) input times its (B, C) shifted state
    broadcasts to (B, B, C))."""
    ours = mixer()
    theirs = their_layer(modeling_rwkv.RwkvSelfAttention, time_mix_tensors(ours), config())
    x = torch.randn(1, 20, C)
    state, hf_state = ours.new_state(1, 20), their_state(1, C)
    with torch.no_grad():
        for piece in (slice(0, 13), slice(13, 19), slice(19, 20)):
            out = ours(x[:, piece], context(piece.stop - piece.start), state)
            expected, hf_state = theirs(x[:, piece], state=hf_state, use_cache=True)
            assert relative_difference(out, expected) < 1e-5
            got = (state.shift, state.num, state.den, state.max)
            assert relative_difference(got, tuple(s[:, :, 0] for s in hf_state[1:])) < 1e-5


def test_the_channel_mix_with_receptance_equals_transformers_rwkv_feed_forward():
    """Its (1 − μ) token-shift convention against transformers' μ: within 1e-5, whole and from a
    state (9 tokens, 1, 5)."""
    ours = channel_mix()
    theirs = their_layer(modeling_rwkv.RwkvFeedForward, channel_mix_tensors(ours), config())
    x = torch.randn(1, 15, C)  # one row, as above
    state, hf_state = ours.new_state(1, 15), their_state(1, C)
    with torch.no_grad():
        assert relative_difference(ours(x, context(15)), theirs(x)[0]) < 1e-5
        for piece in (slice(0, 9), slice(9, 10), slice(10, 15)):
            expected, hf_state = theirs(x[:, piece], state=hf_state)
            assert relative_difference(ours(x[:, piece], context(piece.stop - piece.start), state), expected) < 1e-5


def test_the_time_mix_matches_the_layer_token_by_token():
    """The whole forward (11 tokens, chunks of 8) and decoding through the state, in float64."""
    matches_reference(mixer(width=24), rwkv4_time_mix, lambda m, x, run: run(x, time_mix_tensors(m))[0])


def test_the_channel_mix_with_receptance_matches_the_block_token_by_token():
    matches_reference(channel_mix(), rwkv4_channel_mix, lambda m, x, run: run(x, channel_mix_tensors(m))[0])


@pytest.mark.parametrize("make", [mixer, channel_mix], ids=["time-mix", "channel-mix"])
def test_long_inputs_run_in_segments_equal_to_the_whole(monkeypatch, make):
    """Segments of 8 over 30 tokens, a left-padded row, a state that continues."""
    monkeypatch.setattr(_segments, "SEGMENT", 8)
    segments_equivalence(make(), length=30, pad=11, atol=1e-6)


def test_left_padding_leaves_the_state_and_the_outputs_as_for_the_row_alone():
    layer = mixer().double()
    x = torch.randn(2, 12, C, dtype=torch.float64)
    padding = torch.ones(2, 12, dtype=torch.long)
    padding[1, :5] = 0
    with torch.no_grad():
        state, alone_state = layer.new_state(2, 12), layer.new_state(1, 7)
        padded = layer(x, context(12, padding), state)[1, 5:]
        alone = layer(x[1:, 5:], context(7), alone_state)[0]
    assert relative_difference(padded, alone) < 1e-12
    for name, value in vars(alone_state).items():
        assert relative_difference(getattr(state, name)[1:], value) < 1e-12, name


def test_bfloat16_inputs_run_with_float32_statistics_and_state():
    """The token shift holds inputs: bfloat16 in a bfloat16 layer; num, den, max float32; within 3%."""
    bfloat16_equivalence(mixer(), inputs=("shift",), length=30, tolerance=3e-2)


# -- parameters, options and errors -----------------------------------------------------------------
def test_the_parameters_start_as_the_authors_and_map_onto_transformers():
    layer = seqzoo.registry().create("mixer", {"kind": "rwkv4", "width": 48}, 64)
    assert layer.k_proj.weight.shape == (48, 64) and layer.out_proj.weight.shape == (64, 48)
    assert layer.time_decay.shape == layer.time_first.shape == (48,) and layer.time_mix.shape == (3, 64)
    assert layer.time_decay.min() == -5 and layer.time_decay.max() == 3  # e^{−5} to e^3 per step
    assert set(layer.no_weight_decay) <= {name for name, _ in layer.named_parameters()}
    state = layer.new_state(2, 10, dtype=torch.bfloat16)
    assert state.shift.dtype == torch.bfloat16 and state.num.dtype == state.max.dtype == torch.float32
    assert state.num.shape == (2, 48) and (state.max == EMPTY).all()
    plain = seqzoo.registry().create("mixer", {"kind": "rwkv_channel_mix"}, 64)
    assert plain.receptance is None and plain.x_r is None


def test_configuration_errors_name_the_option_and_the_fix():
    with pytest.raises(ConfigError, match=r"rwkv4: chunk=24 must be a power of two .*use 32"):
        seqzoo.registry().create("mixer", {"kind": "rwkv4", "chunk": 24}, C)


# -- the recipe -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return seqzoo.build("tiny-rwkv4", device="cpu").eval()


def test_the_recipe_alternates_time_and_channel_mix_each_with_its_state(tiny):
    kinds = [type(b.mixer).__name__ for b in tiny.decoder.blocks]
    assert kinds == ["RWKV4", "RWKVChannelMix"] * 4 and all(b.ffn is None for b in tiny.decoder.blocks)
    assert tiny.decoder.blocks[1].mixer.receptance is not None and not tiny.tie_embeddings
    cache = tiny.new_cache(1, 16)
    assert cache.states[0].num.shape == (1, 64) and cache.states[1].shift.shape == (1, 64)


def test_cached_decoding_of_the_recipe_equals_the_full_forward(tiny):
    """80 tokens, 3 and then one at a time (several scan chunks), within 1e-5; a 90-token prompt,
    70 prefilled and 20 steps on, within 1e-4; greedy the same with and without the cache."""
    kv_cache_equivalence(tiny, length=80)
    kv_cache_equivalence(tiny, length=90, prefill=70, tolerance=1e-4)


def test_left_padded_rows_of_the_recipe_decode_as_each_row_alone(tiny):
    left_padding_equivalence(tiny, length=12, pad=5, new_tokens=16)


def test_beam_search_reorders_the_recipes_states(tiny):
    beam_search_equivalence(tiny, prompt=6, new_tokens=10, beam_size=3)


def test_static_cache_decoding_of_the_recipe_equals_the_growing_cache(tiny):
    static_cache_equivalence(tiny, steps=12)


# -- fla's kernel on CUDA against the plain path ----------------------------------------------------
@pytest.mark.cuda
def test_on_cuda_fla_kernel_equals_the_torch_path():
    """Forward, every gradient and the decode steps: fla's fused_recurrent_rwkv4 against the
    parallel scan of ``_wkv4`` (SEQZOO_SCAN=torch), on the same mixer."""
    pytest.importorskip("fla")
    if _wkv4._fla_kernel() is None:
        pytest.skip("this fla has no fla.ops.rwkv4")
    layer = seqzoo.registry().create("mixer", {"kind": "rwkv4"}, 128).cuda()
    kernel_paths_agree(layer, torch.randn(2, 300, 128, device="cuda"), tolerance=1e-4)


@pytest.mark.cuda
def test_on_cuda_the_parallel_scan_equals_the_recurrence():
    """The plain path on the GPU (where fla is missing, or SEQZOO_SCAN=torch), in float32."""
    time_decay, time_first, k, v, state = wkv_inputs(300, keys=3.0)
    expected = recurrence(time_decay, time_first, k, v, state=state)
    got = wkv4(*(t.float().cuda() for t in (time_decay, time_first, k, v)), tuple(t.float().cuda() for t in state),
               32, real=torch.ones(2, 300, 1, device="cuda"))
    assert relative_difference(got, expected) < 1e-5
