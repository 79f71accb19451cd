"""What the ``short_conv`` (LFM2) and ``rg_lru`` (Griffin) mixers share as layers: a decoding state
whose size does not grow with the context, long inputs in segments, bfloat16 and autocast, the
shipped recipes (tiny-lfm2, tiny-griffin) decoding through their states exactly as the full
forward does, left padding, beam search, the fixed-shape steps of compiled decoding; and fla's
Triton kernels on CUDA against the plain path. The math of each, and its parity with
transformers, is in test_short_conv.py and test_rg_lru.py."""
from __future__ import annotations

import pytest
import torch

import seqzoo
from seqzoo.nn.generation import CausalSession
from seqzoo.plugins.mixer import _diagonal_scan, _fla_conv
from seqzoo.testing._shared import kv_cache_equivalence, left_padding_equivalence
from seqzoo.testing.mixer import _context

SPECS = [{"kind": "short_conv", "conv_bias": True, "bias": True},
         {"kind": "rg_lru", "heads": 2, "width": 24, "chunk": 16}]
IDS = ["short_conv", "rg_lru"]
#: Each state tensor's shape for 2 rows of a 16-wide model, whatever the context.
STATE_SHAPES = {"short_conv": {"conv": (2, 16, 2)}, "rg_lru": {"conv": (2, 24, 3), "h": (2, 24), "begun": (2,)}}


def context(length: int, padding: torch.Tensor | None = None):
    return _context(torch.arange(length)[None], key_padding=padding)


def moving(spec: dict, dim: int = 16) -> torch.nn.Module:
    """The mixer with its parameters moved off their start (the RG-LRU's gates start near σ(0))."""
    mixer = seqzoo.registry().create("mixer", spec, dim)
    with torch.no_grad():
        for p in mixer.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return mixer


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_the_decoding_state_has_the_same_size_after_10_and_after_600_tokens(spec):
    """A step's cost cannot grow with the context when the state it reads does not."""
    mixer = moving(spec)
    for length in (10, 600):
        state = mixer.new_state(2, length)
        with torch.no_grad():
            mixer(torch.randn(2, length, 16), context(length), state)
            mixer(torch.randn(2, 1, 16), context(1), state)
        assert {name: tuple(t.shape) for name, t in vars(state).items()} == STATE_SHAPES[spec["kind"]]


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_without_autograd_a_long_sequence_runs_in_segments_equal_to_the_whole(spec, monkeypatch):
    """Segments of 8 over 150 tokens, a left-padded row whose pads cross a segment's end: the same
    outputs and the same state as one pass with autograd on."""
    segments = pytest.importorskip("seqzoo.plugins.mixer._segments")
    mixer = moving(spec)
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


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_bfloat16_inputs_and_autocast_keep_a_float32_state_and_stay_close_to_float32(spec):
    """The conv history stays in the model's dtype (it holds inputs); the RG-LRU's h in float32."""
    mixer = moving(spec)
    x = torch.randn(2, 40, 16)
    state = mixer.to(torch.bfloat16).new_state(2, 40)
    with torch.no_grad():
        low = mixer(x.bfloat16(), context(40), state)
        high = mixer.float()(x.bfloat16().float(), context(40))
    assert low.dtype == torch.bfloat16 and state.conv.dtype == torch.bfloat16
    assert getattr(state, "h", torch.zeros(1)).dtype == torch.float32
    assert (low.float() - high).abs().max() <= 0.05 * high.abs().max()
    state = mixer.new_state(2, 40)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):  # the recurrence opts out of autocast
        mixed = mixer(x, context(40), state)
    assert getattr(state, "h", torch.zeros(1)).dtype == torch.float32
    assert (mixed.float() - high).abs().max() <= 0.05 * high.abs().max()


# -- whole models: the shipped recipes -------------------------------------------------------------
@pytest.mark.parametrize("recipe", ["tiny-lfm2", "tiny-griffin"])
def test_cached_greedy_decoding_and_left_padded_rows_equal_the_uncached_model(recipe):
    """seqzoo.testing's model checks (token by token through the states, left-padded batches), a
    90-token prompt prefilled past tiny-griffin's window and several scan chunks before decoding
    on, and beam search, whose reordered states must give what the uncached search gives."""
    model = seqzoo.build(recipe, device="cpu").eval()
    kv_cache_equivalence(model, length=20)
    left_padding_equivalence(model)
    ids = torch.randint(3, 259, (2, 90))
    with torch.no_grad():
        cache = model.new_cache(2, 90)
        pieces = [model(ids[:, :70], cache=cache)] + [model(ids[:, t:t + 1], cache=cache) for t in range(70, 90)]
        assert (torch.cat(pieces, 1) - model(ids)).abs().max() < 1e-4
    prompt = ids[:1, :6]
    beams = seqzoo.generate(model, prompt, 10, beam_size=3, eos_id=None)
    assert torch.equal(beams, seqzoo.generate(model, prompt, 10, beam_size=3, eos_id=None, use_cache=False))


@pytest.mark.parametrize("recipe", ["tiny-lfm2", "tiny-griffin"])
def test_static_cache_decoding_equals_the_growing_cache(recipe):
    """The fixed-shape steps ``generate(compile=True)`` traces, left-padded rows included."""
    model = seqzoo.build(recipe, device="cpu").eval()
    ids, mask = torch.randint(1, 259, (3, 6)), torch.ones(3, 6, dtype=torch.long)
    mask[0, :3] = 0
    runs = []
    with torch.inference_mode():
        for static in (False, True):
            session, token, logits = CausalSession(model, ids, 12, True, mask, static=static), None, []
            for _ in range(12):
                logits.append(session.next(token))
                token = logits[-1].argmax(-1)
            runs.append(torch.stack(logits, 1))
    torch.testing.assert_close(runs[1], runs[0], atol=1e-5, rtol=1e-5)


def test_the_recipes_follow_their_models_layouts():
    lfm2, griffin = seqzoo.build("tiny-lfm2", device="cpu"), seqzoo.build("tiny-griffin", device="cpu")
    assert [type(b.mixer).__name__ for b in lfm2.decoder.blocks] == ["ShortConv", "ShortConv", "AttentionMixer"] * 2
    assert [type(b.mixer).__name__ for b in griffin.decoder.blocks] == ["RGLRU", "RGLRU", "AttentionMixer"] * 2
    attention = lfm2.decoder.blocks[2].mixer
    assert attention.q_norm is not None and attention.k_norm is not None and attention.kv_heads == 2
    attention = griffin.decoder.blocks[2].mixer
    assert (attention.window, attention.kv_heads) == (16, 1)
    for model, shapes in ((lfm2, {"conv": (1, 64, 2)}), (griffin, {"conv": (1, 64, 3), "h": (1, 64), "begun": (1,)})):
        cache = model.new_cache(1, 16)
        assert [type(s).__name__ for s in cache.states[:3]] == ["RecurrentState"] * 2 + ["KVSlice"]
        assert {name: tuple(t.shape) for name, t in vars(cache.states[0]).items()} == shapes


# -- fla's Triton kernels on CUDA against the plain path --------------------------------------------
@pytest.mark.cuda
@pytest.mark.parametrize("spec", SPECS, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_on_cuda_fla_kernels_equal_the_torch_path(spec, dtype, monkeypatch):
    """Forward, every gradient, the decode steps and the state: fla's causal_conv1d (and, for the
    RG-LRU, its HGRN kernels) against torch's conv and the chunked scan (SEQZOO_SCAN=torch)."""
    pytest.importorskip("fla")
    assert _fla_conv._fla_conv() is not None
    assert spec["kind"] != "rg_lru" or _diagonal_scan._fla_kernels() is not None
    mixer = seqzoo.registry().create("mixer", spec, 128).cuda().to(dtype)
    x = torch.randn(2, 300, 128, device="cuda", dtype=dtype)
    tol = 2e-3 if dtype == torch.float32 else 3e-2  # cuDNN may run the float32 conv in tf32

    def run(path: str):
        monkeypatch.setenv("SEQZOO_SCAN", path)
        mixer.zero_grad()
        leaf = x.detach().requires_grad_()
        state = mixer.new_state(2, 300, device="cuda", dtype=dtype)
        out = mixer(leaf[:, :290], context(290), state)
        out.float().square().sum().backward()
        with torch.no_grad():
            steps = [mixer(leaf[:, t:t + 1], context(1), state) for t in range(290, 300)]
        final = [t.float() for t in vars(state).values() if t.is_floating_point()]
        return [out, torch.cat(steps, 1), leaf.grad, *final], [p.grad.clone() for p in mixer.parameters()]

    fla, plain = run("fla"), run("torch")
    for got, want in zip(fla[0], plain[0]):
        assert (got.float() - want.float()).abs().max() <= tol * want.float().abs().max()
    for got, want in zip(fla[1], plain[1]):
        assert (got.float() - want.float()).abs().max() <= tol * want.float().abs().max() + 1e-6
