"""The ``additive`` score (Bahdanau, vᵀ tanh(W_q q + W_k k + b) per head): scores against a naive
broadcast of the formula for several chunk sizes, ``attend`` against the plain masked-softmax path,
gradients through the checkpointed chunks, bounded memory, and a full model."""
from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import seqzoo
from seqzoo.functional import masked_softmax_attend
from seqzoo.plugins.score.additive import Additive

# query_dim differs from key_dim, as for a recurrent decoder reading a bidirectional encoder.
B, H, K, T, S, DQ, DK, A = 2, 4, 2, 7, 6, 5, 8, 3


def qkv(kv_heads: int = H, dtype: torch.dtype = torch.float32):
    q = torch.randn(B, H, T, DQ, dtype=dtype)
    k = torch.randn(B, kv_heads, S, DK, dtype=dtype)
    v = torch.randn(B, kv_heads, S, DK, dtype=dtype)
    return q, k, v


def additive(chunk: int = 64, bias: bool = True, hidden: int | None = A) -> Additive:
    score = Additive(DQ, DK, H, hidden=hidden, bias=bias, chunk=chunk)
    if bias:
        with torch.no_grad():
            score.bias.normal_()  # b starts at zero; make it matter
    return score


def naive_scores(score: Additive, q, k):
    """The whole (B, H, T, S, A) tanh at once, written out from the formula."""
    w_q, w_k, v = score.query_weight.detach(), score.key_weight.detach(), score.vector.detach()
    b = score.bias.detach() if score.bias is not None else torch.zeros_like(v)
    wq = torch.einsum("bhtd,hda->bhta", q, w_q)
    wk = torch.einsum("bhsd,hda->bhsa", k, w_k)
    hidden = torch.tanh(wq[:, :, :, None, :] + wk[:, :, None, :, :] + b[None, :, None, None, :])
    return (hidden * v[None, :, None, None, :]).sum(-1)


def plain(score: Additive, q, k, v, **kwargs):
    """The reference attention: masked softmax over ``score.scores`` with kv heads repeated."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    return masked_softmax_attend(score.scores(q, k), v, **kwargs)


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 64])
def test_scores_match_naive_broadcast_for_chunk_sizes(chunk):
    # T = 7: chunk 2 and 3 leave a ragged last chunk, 7 is exact, 64 > T is a single chunk.
    score, (q, k, _) = additive(chunk=chunk), qkv()
    torch.testing.assert_close(score.scores(q, k), naive_scores(score, q, k))


def test_scores_match_naive_broadcast_without_bias():
    score, (q, k, _) = additive(chunk=3, bias=False), qkv()
    assert score.bias is None
    torch.testing.assert_close(score.scores(q, k), naive_scores(score, q, k))


def test_scores_match_naive_broadcast_with_grad_enabled():
    # The checkpointed path (autograd recording) must compute the same logits.
    score, (q, k, _) = additive(chunk=2), qkv()
    q.requires_grad_(True)
    torch.testing.assert_close(score.scores(q, k), naive_scores(score, q.detach(), k))


def test_hidden_defaults_to_key_dim():
    score = Additive(DQ, DK, H)
    assert score.hidden == DK
    assert score.query_weight.shape == (H, DQ, DK) and score.key_weight.shape == (H, DK, DK)
    assert score.vector.shape == (H, DK) and score.bias.shape == (H, DK)


def test_attend_matches_plain_path_with_random_mask():
    score, (q, k, v) = additive(chunk=3), qkv()
    mask = torch.rand(B, 1, T, S) > 0.4
    torch.testing.assert_close(score.attend(q, k, v, mask=mask), plain(score, q, k, v, mask=mask))


def test_attend_matches_plain_path_when_causal():
    score, (q, k, v) = additive(chunk=3), qkv()
    torch.testing.assert_close(score.attend(q, k, v, causal=True), plain(score, q, k, v, causal=True))


def test_attend_matches_plain_path_with_bias():
    score, (q, k, v) = additive(chunk=3), qkv()
    bias = torch.randn(1, H, T, S)
    torch.testing.assert_close(score.attend(q, k, v, bias=bias, causal=True),
                               plain(score, q, k, v, bias=bias, causal=True))


def test_attend_matches_plain_path_with_grouped_kv_heads():
    score, (q, k, v) = additive(chunk=3), qkv(kv_heads=K)
    mask = torch.rand(B, 1, T, S) > 0.4
    torch.testing.assert_close(score.attend(q, k, v, mask=mask), plain(score, q, k, v, mask=mask))


def test_attend_gives_zeros_for_fully_masked_rows():
    score, (q, k, v) = additive(chunk=3), qkv()
    q.requires_grad_(True)
    mask = torch.rand(B, 1, T, S) > 0.4
    mask[0, :, 4] = False
    out = score.attend(q, k, v, mask=mask)
    assert torch.equal(out[0, :, 4], torch.zeros(H, DK))
    out.sum().backward()
    assert torch.isfinite(q.grad).all() and torch.isfinite(score.vector.grad).all()


def test_attend_gradients_pass_gradcheck_in_float64():
    # chunk 2 over T = 3 queries: two checkpointed chunks, the second ragged.
    score = Additive(2, 3, 2, hidden=2, chunk=2).double()
    with torch.no_grad():
        score.bias.normal_()
    q = torch.randn(1, 2, 3, 2, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 1, 4, 3, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 1, 4, 2, dtype=torch.float64, requires_grad=True)
    params = (score.query_weight, score.key_weight, score.bias, score.vector)
    # The parameters are inputs too: gradcheck perturbs them in place, attend reads the module.
    assert torch.autograd.gradcheck(
        lambda q, k, v, *_: score.attend(q, k, v, causal=True), (q, k, v, *params))


def peak_bytes(fn) -> int:
    """Peak CPU memory allocated while ``fn`` runs, replaying the profiler's per-op allocations
    (each op's own allocations minus frees) in time order."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    current = peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        current += event.self_cpu_memory_usage
        peak = max(peak, current)
    return peak


def memory_case():
    b, h, t, d, a, chunk = 1, 1, 256, 16, 64, 64
    score = Additive(d, d, h, hidden=a, chunk=chunk)
    q, k = torch.randn(b, h, t, d), torch.randn(b, h, t, d)
    full = b * h * t * t * a * 4  # bytes of one float32 (B, H, T, S, A) tensor: 16 MiB
    # A chunk's (B, H, chunk, S, A) sum and its tanh may coexist (4 MiB each); allow three.
    bound = 3 * b * h * chunk * t * a * 4
    assert bound < full
    return score, q, k, full, bound


def test_forward_memory_stays_below_one_full_tanh_tensor():
    score, q, k, full, bound = memory_case()
    with torch.no_grad():
        naive = peak_bytes(lambda: naive_scores(score, q, k))
        chunked = peak_bytes(lambda: score.scores(q, k))
    assert naive >= full  # the measurement does see the naive (B, H, T, S, A) tensor
    assert chunked < bound


def test_backward_memory_stays_below_one_full_tanh_tensor():
    score, q, k, full, bound = memory_case()
    q.requires_grad_(True)
    # Without checkpointing autograd would keep every chunk's tanh output (16 MiB in all) for
    # backward: measured at 20 MiB, well above the bound.
    assert peak_bytes(lambda: score.scores(q, k).sum().backward()) < bound
    assert q.grad is not None and score.vector.grad is not None


def test_builds_from_recipe_and_cached_generation_matches_uncached():
    # chunk 4 < prompt length 6, so the prefill runs several chunks.
    model = seqzoo.build("tiny-gpt", ["model.attention.score={kind: additive, chunk: 4}"],
                         device="cpu").eval()
    scores = [m for m in model.modules() if isinstance(m, Additive)]
    assert len(scores) == 4  # one per layer
    score = scores[0]
    assert score.chunk == 4 and score.hidden == score.key_dim
    ids = torch.randint(0, 256, (2, 6))
    with torch.no_grad():
        assert model(ids).shape == (2, 6, model.vocab_size)
    cached = seqzoo.generate(model, ids, 8, use_cache=True)
    uncached = seqzoo.generate(model, ids, 8, use_cache=False)
    assert torch.equal(cached, uncached)


def test_recipe_rejects_zero_chunk():
    with pytest.raises(seqzoo.RecipeError, match=r"model\.attention\.score\.chunk: 0 is out of range"):
        seqzoo.build("tiny-gpt", ["model.attention.score={kind: additive, chunk: 0}"], device="cpu")
