"""The delta-rule machinery gated DeltaNet and KDA share (``_delta_rule``): the chunked WY form and
the decode step against ``seqzoo.reference.delta_rule`` (token by token, float64) without decay
(DeltaNet), with a scalar decay per head (gated DeltaNet) and a decay per key channel (KDA), with
more value heads than key heads and lengths that are not multiples of the chunk; the float32
gradients; padding; long inputs in segments; and the two shipped recipes, whose state-cached
decoding must equal the full forward. The layers against transformers are in test_gated_deltanet.py
and test_kda.py."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import seqzoo
from seqzoo.errors import InputError
from seqzoo.plugins.mixer import _delta_rule
from seqzoo.plugins.mixer._delta_rule import chunked, l2norm, step
from seqzoo.reference.delta_rule import delta_rule
from seqzoo.testing._shared import kv_cache_equivalence, left_padding_equivalence

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
    expected, final = run_reference(t)
    out, last = run_chunked(t, chunk)
    assert (out - expected).abs().max() <= 1e-12 * expected.abs().max()
    assert (last - final).abs().max() <= 1e-12 * final.abs().max()


@pytest.mark.parametrize("decay", ["head", "channel"])
def test_steep_decays_neither_overflow_nor_drift(decay):
    """Decays of e^−60 per step (a chunk of 64 spans e^−3800): every exponent is a difference
    Γ_t − Γ_s ≤ 0, so the chunked form stays finite and exact."""
    t = inputs(decay, rate=60.0)
    expected, final = run_reference(t)
    out, last = run_chunked(t, 64)
    assert torch.isfinite(out).all() and torch.isfinite(last).all()
    assert (out - expected).abs().max() <= 1e-12 * expected.abs().max()
    assert (last - final).abs().max() <= 1e-12 * final.abs().max()


@pytest.mark.parametrize("decay", DECAYS)
def test_chunked_form_in_float32_stays_within_1e_5_of_float64(decay):
    t = inputs(decay, length=200)
    expected, final = run_reference(t)
    out, last = run_chunked({name: None if x is None else x.float() for name, x in t.items()}, 16)
    assert out.dtype == last.dtype == torch.float32
    assert (out.double() - expected).abs().max() <= 1e-5 * expected.abs().max()
    assert (last.double() - final).abs().max() <= 1e-5 * final.abs().max()


@pytest.mark.parametrize("decay", DECAYS)
def test_float32_gradients_of_the_chunked_form_match_the_float64_recurrence(decay):
    """Every input's gradient (q, k, v, β, g, S_0), float32 chunks of 16 over 50 tokens against
    float64 autograd through the token-by-token recurrence."""
    t = inputs(decay, length=50)
    gen = torch.Generator().manual_seed(5)
    weights = torch.randn(2, 50, KEY_HEADS * PER, VALUE_WIDTH, generator=gen, dtype=F64)
    weights_last = torch.randn(t["state"].shape, generator=gen, dtype=F64)
    names = [name for name, x in t.items() if x is not None]

    def grads(run, dtype):
        leaves = {name: None if x is None else x.detach().to(dtype).requires_grad_() for name, x in t.items()}
        out, last = run(leaves)
        ((out * weights.to(dtype)).sum() + (last * weights_last.to(dtype)).sum()).backward()
        return {name: leaves[name].grad.double() for name in names}

    expected, got = grads(run_reference, F64), grads(lambda x: run_chunked(x, 16), torch.float32)
    for name in names:
        assert torch.isfinite(got[name]).all(), name
        assert (got[name] - expected[name]).abs().max() <= 1e-4 * expected[name].abs().max(), name


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
    assert (out - expected).abs().max() <= 1e-5 * expected.abs().max()
    assert (last - final).abs().max() <= 1e-5 * final.abs().max()


def test_the_reference_refuses_value_heads_that_are_not_a_multiple_of_the_key_heads():
    t = inputs("head", length=3)
    with pytest.raises(InputError, match=r"value heads=6 .* must be a multiple of key heads=4"):
        delta_rule(t["q"].repeat(1, 1, 2, 1), t["k"].repeat(1, 1, 2, 1), t["v"], t["beta"], t["g"])


# -- the mixers: long inputs in segments, dtypes ---------------------------------------------------
SPECS = [{"kind": "gated_deltanet", "heads": 2, "head_dim": 8, "value_heads": 4, "chunk": 16},
         {"kind": "kda", "heads": 2, "head_dim": 8}]


def context(length: int, padding: torch.Tensor | None = None) -> seqzoo.interfaces.MixerContext:
    t = torch.arange(length)[None]
    return seqzoo.interfaces.MixerContext(position=None, q_pos=t, k_pos=t, mask=None, causal=True, prepared={},
                                          padding=padding)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s["kind"])
def test_without_autograd_a_long_sequence_runs_in_segments_equal_to_the_whole(spec, monkeypatch):
    """Segments of 8 over 150 tokens, a left-padded row whose pads cross a segment's end: the same
    outputs and the same state (conv inputs and S) as one pass with autograd on."""
    segments = pytest.importorskip("seqzoo.plugins.mixer._segments")
    mixer = seqzoo.registry().create("mixer", spec, 16)
    x = torch.randn(2, 150, 16)
    padding = torch.ones(2, 150, dtype=torch.long)
    padding[1, :11] = 0
    whole_state, cut_state = mixer.new_state(2, 150), mixer.new_state(2, 150)
    whole = mixer(x, context(150, padding), whole_state).detach()
    monkeypatch.setattr(segments, "SEGMENT", 8)
    with torch.no_grad():
        cut = mixer(x, context(150, padding), cut_state)
    torch.testing.assert_close(cut, whole, atol=1e-5, rtol=1e-5)
    for name, value in vars(whole_state).items():
        torch.testing.assert_close(getattr(cut_state, name), value.detach(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s["kind"])
def test_bfloat16_inputs_and_autocast_keep_a_float32_state_and_stay_close_to_float32(spec):
    mixer = seqzoo.registry().create("mixer", spec, 16)
    x = torch.randn(2, 40, 16)
    state = mixer.to(torch.bfloat16).new_state(2, 40)
    with torch.no_grad():
        low = mixer(x.bfloat16(), context(40), state)
        high = mixer.float()(x.bfloat16().float(), context(40))
    assert low.dtype == torch.bfloat16 and state.S.dtype == torch.float32 and state.conv.dtype == torch.bfloat16
    assert (low.float() - high).abs().max() <= 0.05 * high.abs().max()
    state = mixer.new_state(2, 40)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):  # the recurrence opts out of autocast
        mixed = mixer(x, context(40), state)
    assert state.S.dtype == torch.float32 and (mixed.float() - high).abs().max() <= 0.05 * high.abs().max()


# -- whole models: the shipped recipes -------------------------------------------------------------
RECIPES = ["tiny-gdn", "tiny-kda"]


@pytest.mark.parametrize("recipe", RECIPES)
def test_cached_greedy_decoding_and_left_padded_rows_equal_the_uncached_model(recipe):
    """seqzoo.testing's model checks (token by token through the states, left-padded batches), a
    90-token prompt prefilled through several chunks before decoding on, and beam search, whose
    reordered states must give what the uncached search gives."""
    model = seqzoo.build(recipe, device="cpu").eval()
    kv_cache_equivalence(model, length=20)
    left_padding_equivalence(model)
    ids = torch.randint(3, 259, (2, 90))  # more than one chunk of 64
    with torch.no_grad():
        cache = model.new_cache(2, 90)
        pieces = [model(ids[:, :70], cache=cache)] + [model(ids[:, t:t + 1], cache=cache) for t in range(70, 90)]
        assert (torch.cat(pieces, 1) - model(ids)).abs().max() < 1e-4
    prompt = ids[:1, :6]
    beams = seqzoo.generate(model, prompt, 10, beam_size=3, eos_id=None)
    assert torch.equal(beams, seqzoo.generate(model, prompt, 10, beam_size=3, eos_id=None, use_cache=False))


def test_the_recipes_follow_their_models_patterns():
    gdn, kda = seqzoo.build("tiny-gdn", device="cpu"), seqzoo.build("tiny-kda", device="cpu")
    assert [type(b.mixer).__name__ for b in gdn.decoder.blocks] == (["GatedDeltaNet"] * 3 + ["AttentionMixer"]) * 2
    assert [type(b.mixer).__name__ for b in kda.decoder.blocks] == (["KDA"] * 3 + ["AttentionMixer"]) * 2
    layer = gdn.decoder.blocks[0].mixer
    assert (layer.key_heads * layer.head_dim, layer.heads * layer.value_head_dim) == (64, 128)  # C and 2C
    cache = gdn.new_cache(1, 16)
    assert [type(s).__name__ for s in cache.states[:4]] == ["RecurrentState"] * 3 + ["KVSlice"]
    assert cache.states[0].S.shape == (1, 4, 32, 32)


# -- fla's Triton kernels on CUDA against the plain path --------------------------------------------
@pytest.mark.cuda
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s["kind"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_on_cuda_fla_kernels_equal_the_torch_path(spec, dtype, monkeypatch):
    """Forward, every gradient and the decode steps: fla's chunk and fused-recurrent kernels
    against the chunked form of ``_delta_rule`` (SEQZOO_SCAN=torch), on the same mixer."""
    pytest.importorskip("fla")
    if _delta_rule._fla_kernels(spec["kind"] == "kda") is None:
        pytest.skip(f"the installed fla has no kernel for {spec['kind']}")
    mixer = seqzoo.registry().create("mixer", {**spec, "head_dim": 64}, 128).cuda().to(dtype)
    x = torch.randn(2, 300, 128, device="cuda", dtype=dtype)
    tol = 5e-3 if dtype == torch.float32 else 5e-2  # fla's dots may run in tf32 or bfloat16

    def run(path: str):
        monkeypatch.setenv("SEQZOO_SCAN", path)
        mixer.zero_grad()
        leaf = x.detach().requires_grad_()
        state = mixer.new_state(2, 300, device="cuda", dtype=dtype)
        out = mixer(leaf[:, :290], context(290), state)
        out.float().square().sum().backward()
        with torch.no_grad():
            steps = [mixer(leaf[:, t:t + 1], context(1), state) for t in range(290, 300)]
        return out, torch.cat(steps, 1), leaf.grad, [p.grad.clone() for p in mixer.parameters()], state.S

    fla, plain = run("fla"), run("torch")
    for got, want in zip(fla[:3] + (fla[4],), plain[:3] + (plain[4],)):
        assert (got.float() - want.float()).abs().max() <= tol * want.float().abs().max()
    for got, want in zip(fla[3], plain[3]):
        assert (got.float() - want.float()).abs().max() <= tol * want.float().abs().max() + 1e-6
