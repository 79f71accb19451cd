"""The delta-rule machinery gated DeltaNet and KDA share (``_delta_rule``): the chunked WY form and
the decode step against ``seqzoo.reference.delta_rule`` (token by token, float64) without decay
(DeltaNet), with a scalar decay per head (gated DeltaNet) and a decay per key channel (KDA), with
more value heads than key heads and lengths that are not multiples of the chunk; the float32
gradients; padding; transformers' functions; and the two shipped recipes' layouts. The layers
against transformers are in test_gated_deltanet.py and test_kda.py; what they share with the other
recurrent mixers (segments, bfloat16, fla on CUDA) in test_recurrent_mixers.py, and the recipes'
decoding in test_recurrent_recipes.py."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import seqzoo
from seqzoo.errors import InputError
from seqzoo.plugins.mixer import _delta_rule
from seqzoo.plugins.mixer._delta_rule import chunked, l2norm, step
from seqzoo.reference.delta_rule import delta_rule
from seqzoo.testing import gradients_match_reference, relative_difference

F64 = torch.float64
DECAYS = ["none", "head", "channel"]  # DeltaNet, gated DeltaNet, KDA
KEY_HEADS, PER, WIDTH, VALUE_WIDTH = 2, 3, 5, 4  # GVA: each key head serves 3 value heads


def inputs(decay: str, length: int = 45, rate: float = 1.0, batch: int = 2, per: int = PER) -> dict:
    """q (unscaled), k L2-normalised (B, T, 2, 5); v (B, T, 2·per, 4); β ∈ (0, 1); g ≤ 0; S_0."""
    gen = torch.Generator().manual_seed(1)
    heads = KEY_HEADS * per

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=F64)

    g = {"none": None, "head": -F.softplus(randn(batch, length, heads)) * rate,
         "channel": -F.softplus(randn(batch, length, heads, WIDTH)) * rate}[decay]
    return {"q": l2norm(randn(batch, length, KEY_HEADS, WIDTH)), "k": l2norm(randn(batch, length, KEY_HEADS, WIDTH)),
            "v": randn(batch, length, heads, VALUE_WIDTH),
            "beta": torch.rand(batch, length, heads, generator=gen, dtype=F64), "g": g,
            "state": randn(batch, heads, WIDTH, VALUE_WIDTH)}


def run_chunked(t: dict, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    return chunked(t["q"] * WIDTH ** -0.5, t["k"], t["v"], t["beta"], t["g"], t["state"], chunk)


def run_reference(t: dict) -> tuple[torch.Tensor, torch.Tensor]:
    return delta_rule(t["q"], t["k"], t["v"], t["beta"], t["g"], state=t["state"])


@pytest.mark.parametrize("chunk", [1, 7, 64])
@pytest.mark.parametrize("decay", DECAYS)
def test_chunked_form_equals_the_recurrence_in_float64(decay, chunk):
    t = inputs(decay)  # 45 tokens: 7 chunks of 7 with a remainder of 3, one padded chunk of 64
    assert relative_difference(run_chunked(t, chunk), run_reference(t)) <= 1e-12


@pytest.mark.parametrize("decay", ["head", "channel"])
def test_steep_decays_neither_overflow_nor_drift(decay):
    """Decays of e^−60 per step (a chunk of 64 spans e^−3800): every exponent is a difference
    Γ_t − Γ_s ≤ 0, so the chunked form stays finite and exact."""
    t = inputs(decay, rate=60.0)
    out, last = run_chunked(t, 64)
    assert torch.isfinite(out).all() and torch.isfinite(last).all()
    assert relative_difference((out, last), run_reference(t)) <= 1e-12


@pytest.mark.parametrize("decay", DECAYS)
def test_chunked_form_in_float32_stays_within_1e_5_of_float64(decay):
    t = inputs(decay, length=200)
    expected, final = run_reference(t)
    out, last = run_chunked({name: None if x is None else x.float() for name, x in t.items()}, 16)
    assert out.dtype == last.dtype == torch.float32
    assert relative_difference((out, last), (expected, final)) <= 1e-5


@pytest.mark.parametrize("decay", DECAYS)
def test_float32_gradients_of_the_chunked_form_match_the_float64_recurrence(decay):
    """Every input's gradient (q, k, v, β, g, S_0), float32 chunks of 16 over 50 tokens against
    float64 autograd through the token-by-token recurrence."""
    gradients_match_reference(lambda t: run_chunked(t, 16), run_reference, inputs(decay, length=50))


@pytest.mark.parametrize("decay", DECAYS)
def test_decode_steps_equal_the_recurrence(decay):
    t = inputs(decay, length=9)
    expected, final = run_reference(t)
    S = t["state"]
    for i in range(9):
        g = None if t["g"] is None else t["g"][:, i]
        o, S = step(t["q"][:, i] * WIDTH ** -0.5, t["k"][:, i], t["v"][:, i], t["beta"][:, i], g, S)
        assert torch.allclose(o, expected[:, i], atol=1e-12)
    assert torch.allclose(S, final, atol=1e-12)


@pytest.mark.parametrize("decay", DECAYS)
def test_steps_with_zero_beta_and_decay_leave_the_state_as_it_was(decay):
    t = inputs(decay, length=4)
    t["beta"] = torch.zeros_like(t["beta"])
    t["g"] = None if t["g"] is None else torch.zeros_like(t["g"])
    assert torch.equal(run_chunked(t, 64)[1], t["state"])
    assert torch.equal(step(t["q"][:, 0], t["k"][:, 0], t["v"][:, 0], t["beta"][:, 0],
                            None if t["g"] is None else t["g"][:, 0], t["state"])[1], t["state"])


#: transformers' plain-torch functions: (module, chunked, recurrent), for a decay per head and per channel.
TRANSFORMERS = {"head": ("qwen3_next", "torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule"),
                "channel": ("kimi_linear", "chunk_kimi_delta_attention", "recurrent_kimi_delta_attention")}


@pytest.mark.parametrize("length", [45, 1], ids=["chunked", "decode-step"])
@pytest.mark.parametrize("decay", ["head", "channel"], ids=["gated_delta_rule", "kimi_delta_attention"])
def test_the_delta_rule_equals_transformers_functions(decay, length):
    """``_delta_rule.delta_rule`` (which L2-normalises q and k and scales q, as transformers does
    with use_qk_l2norm_in_kernel) from an initial state, in float32: 45 tokens in chunks of 16
    against transformers' chunked function (chunks of 64), one token through the decode step
    against its recurrent one. Qwen3-Next's takes grouped value heads, Kimi Linear's does not."""
    name, chunk_fn, recurrent_fn = TRANSFORMERS[decay]
    module = pytest.importorskip(f"transformers.models.{name}.modeling_{name}")
    t = {key: None if x is None else x.float()
         for key, x in inputs(decay, length, per=PER if decay == "head" else 1).items()}
    reference = getattr(module, chunk_fn if length > 1 else recurrent_fn)
    expected, final = reference(t["q"], t["k"], t["v"], g=t["g"], beta=t["beta"], initial_state=t["state"],
                                output_final_state=True, use_qk_l2norm_in_kernel=True)
    out, last = _delta_rule.delta_rule(t["q"], t["k"], t["v"], t["beta"], t["g"], t["state"], 16)
    assert relative_difference((out, last), (expected, final)) <= 1e-5


def test_the_reference_refuses_value_heads_that_are_not_a_multiple_of_the_key_heads():
    t = inputs("head", length=3)
    with pytest.raises(InputError, match=r"value heads=6 .* must be a multiple of key heads=4"):
        delta_rule(t["q"].repeat(1, 1, 2, 1), t["k"].repeat(1, 1, 2, 1), t["v"], t["beta"], t["g"])


# -- the shipped recipes ---------------------------------------------------------------------------
def test_the_recipes_follow_their_models_patterns():
    gdn, kda = seqzoo.build("tiny-gdn", device="cpu"), seqzoo.build("tiny-kda", device="cpu")
    assert [type(b.mixer).__name__ for b in gdn.decoder.blocks] == (["GatedDeltaNet"] * 3 + ["AttentionMixer"]) * 2
    assert [type(b.mixer).__name__ for b in kda.decoder.blocks] == (["KDA"] * 3 + ["AttentionMixer"]) * 2
    layer = gdn.decoder.blocks[0].mixer
    assert (layer.key_heads * layer.head_dim, layer.heads * layer.value_head_dim) == (64, 128)  # C and 2C
    cache = gdn.new_cache(1, 16)
    assert [type(s).__name__ for s in cache.states[:4]] == ["RecurrentState"] * 3 + ["KVSlice"]
    assert cache.states[0].S.shape == (1, 4, 32, 32)
