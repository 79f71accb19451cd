"""Static KV-cache decoding (the shapes a compiled step needs) equals the growing cache, and the
few-row Linear path equals F.linear. The compiled runs themselves are in test_compile.py (slow)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import seqzoo
from seqzoo.errors import InputError
from seqzoo.nn.generation import CausalSession
from seqzoo.nn.linear import FEW_ROWS, Linear, few_rows_linear
from seqzoo.testing import greedy_logits

DECODERS = [
    ("tiny-gpt", []),  # learned positions, MHA
    ("tiny-llama", []),  # RoPE + YaRN, GQA
    ("tiny-mistral", []),  # sliding window 8 (shorter than the decode), GQA
    ("tiny-bloom", []),  # ALiBi bias over every cached key
    ("tiny-gpt", ["model.position=t5"]),
    ("tiny-gpt", ["model.position=sinusoidal"]),
    ("tiny-gpt", ["model.position=shaw"]),
    ("tiny-gpt", ["model.position=xl"]),
    ("tiny-gpt", ["model.position=none", "model.attention.kv_heads=1"]),
    ("tiny-llama", ["model.position={kind: rope, scaling: {kind: dynamic, factor: 2, original_max_seq_len: 16}}"]),
    ("tiny-gpt", ["model.attention.score=additive"]),
]


@pytest.mark.parametrize(("recipe", "overrides"), DECODERS)
@pytest.mark.parametrize("padded", [False, True])
def test_static_cache_equals_growing_cache(recipe, overrides, padded):
    model = seqzoo.build(recipe, overrides, device="cpu").eval()
    ids = torch.randint(1, model.vocab_size, (3, 6))
    mask = None
    if padded:  # rows of 3, 6 and 5 real tokens, left-padded
        mask = torch.ones(3, 6, dtype=torch.long)
        mask[0, :3] = 0
        mask[2, :1] = 0
    with torch.inference_mode():
        growing, _ = greedy_logits(model, ids, 20, mask)
        static, session = greedy_logits(model, ids, 20, mask, static=True)
    assert session.cache.slot is not None and session.cache.max_len == 32  # 6 + 20 rounded up to 32
    torch.testing.assert_close(static, growing, atol=1e-5, rtol=1e-5)


def test_static_cache_under_autocast_equals_growing_cache():
    model = seqzoo.build("tiny-llama", device="cpu").eval()
    ids = torch.randint(1, model.vocab_size, (2, 5))
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        growing, _ = greedy_logits(model, ids, 8)
        static, _ = greedy_logits(model, ids, 8, static=True)
    torch.testing.assert_close(static, growing, atol=1e-2, rtol=1e-2)


def test_static_steps_keep_their_shapes_and_read_no_python_length(tiny_gpt):
    """Every static step passes tensors of one shape; the cache's Python length only counts."""
    ids = torch.randint(1, 256, (2, 5))
    seen = []
    session = CausalSession(tiny_gpt, ids, 10, True, static=True)

    def spy(model, tokens, positions, cache):
        seen.append((tokens.shape, positions.shape, cache.slot.shape, cache.valid.shape,
                     tuple(state.k.shape for state in cache.states)))
        return real(model, tokens, positions, cache)

    real, session.step = session.step, spy
    token = None
    with torch.inference_mode():
        for _ in range(10):
            token = session.next(token).argmax(-1)
    assert len(seen) == 9 and len(set(seen)) == 1
    assert session.cache.length == 5 + 9 and int(session.cache.slot) == 14


def test_static_generate_through_beam_reorder_and_errors(tiny_gpt):
    ids = torch.randint(1, 256, (2, 4))
    with pytest.raises(InputError, match="need the KV cache"):
        CausalSession(tiny_gpt, ids, 4, False, static=True)
    with pytest.raises(InputError, match="beam search runs eagerly"):
        seqzoo.generate(tiny_gpt, ids, 4, compile=True, beam_size=2)
    xl = seqzoo.build("tiny-gpt", ["model.position=xl"], device="cpu").eval()
    with pytest.raises(InputError, match="TransformerXLRelative changes shape from step to step"):
        seqzoo.generate(xl, ids, 4, compile=True)
    t5 = seqzoo.build("tiny-t5", device="cpu").eval()
    with pytest.raises(InputError, match="EncoderDecoder decodes eagerly only"):
        seqzoo.generate(t5, ids, 4, compile=True)
    # a static cache follows reordered rows like the growing one does
    with torch.inference_mode():
        a = CausalSession(tiny_gpt, ids, 6, True)
        b = CausalSession(tiny_gpt, ids, 6, True, static=True)
        token_a, token_b = a.next(None).argmax(-1), b.next(None).argmax(-1)
        b.next(token_b)
        a.next(token_a)
        rows = torch.tensor([1, 1])
        a.reorder(rows)
        b.reorder(rows)
        token = torch.tensor([7, 9])
        torch.testing.assert_close(b.next(token), a.next(token), atol=1e-5, rtol=1e-5)


def test_static_decoding_stops_at_the_learned_position_table():
    model = seqzoo.build("tiny-gpt", ["model.max_seq_len=12"], device="cpu").eval()
    ids = torch.randint(1, 256, (1, 8))
    session = CausalSession(model, ids, 10, True, static=True)
    token = None
    with torch.inference_mode(), pytest.raises(InputError, match="exceeds the 12 positions"):
        for _ in range(10):
            token = session.next(token).argmax(-1)


@pytest.mark.parametrize("rows", [1, 2, 5, 8, FEW_ROWS])
@pytest.mark.parametrize("bias", [True, False])
def test_few_rows_linear_equals_linear(rows, bias):
    layer = Linear(48, 80, bias=bias)
    x = torch.randn(rows, 1, 48)
    want = F.linear(x, layer.weight, layer.bias)
    got = few_rows_linear(x, layer.weight, layer.bias)
    assert got.shape == (rows, 1, 80) and got.is_contiguous()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), want, atol=1e-5, rtol=1e-5)


def test_linear_keeps_autograd_big_inputs_and_other_dtypes_on_f_linear(monkeypatch):
    layer = Linear(16, 8)
    calls = []
    monkeypatch.setattr("seqzoo.nn.linear.WEIGHT_STREAMING", True)  # as on an AMD CPU
    monkeypatch.setattr("seqzoo.nn.linear.few_rows_linear", lambda *a: calls.append(a) or F.linear(*a))
    x = torch.randn(2, 16, requires_grad=True)
    layer(x).sum().backward()  # gradients recorded: F.linear
    assert x.grad is not None and not calls
    with torch.no_grad():
        layer(torch.randn(FEW_ROWS + 1, 16))  # too many rows: F.linear
        layer.double()(torch.randn(3, 16, dtype=torch.float64))  # not float32: F.linear
        assert not calls
        layer.float()(torch.randn(3, 16))  # the fast path
    assert len(calls) == 1
    assert isinstance(layer, torch.nn.Linear) and set(layer.state_dict()) == {"weight", "bias"}


def test_the_few_row_path_is_taken_on_amd_cpus_only(monkeypatch):
    """It streams weights 2x faster on AMD EPYC and 2-3x slower on Intel Xeon (docs/performance.md)."""
    import io

    from seqzoo.nn import linear

    cpuinfo = {"amd": "vendor_id\t: AuthenticAMD\n", "intel": "vendor_id\t: GenuineIntel\n"}
    for vendor, text in cpuinfo.items():
        monkeypatch.setattr("builtins.open", lambda *a, text=text, **k: io.StringIO(text))
        assert linear._amd_cpu() is (vendor == "amd")
    monkeypatch.setattr("seqzoo.nn.linear.WEIGHT_STREAMING", False)
    calls = []
    monkeypatch.setattr("seqzoo.nn.linear.few_rows_linear", lambda *a: calls.append(a) or F.linear(*a))
    with torch.no_grad():
        Linear(16, 8)(torch.randn(3, 16))
    assert not calls
