"""The ``dot`` score (Luong dot, unscaled by default): scores against a direct einsum of the
formula, the fused ``attend`` against the plain masked-softmax path, gradients, and a full model."""
from __future__ import annotations

import math

import pytest
import torch

import seqzoo
from seqzoo.errors import ConfigError
from seqzoo.functional import masked_softmax_attend
from seqzoo.plugins.score.dot import Dot

B, H, K, T, S, D = 2, 4, 2, 5, 7, 8


def qkv(kv_heads: int = H, dtype: torch.dtype = torch.float32):
    q = torch.randn(B, H, T, D, dtype=dtype)
    k = torch.randn(B, kv_heads, S, D, dtype=dtype)
    v = torch.randn(B, kv_heads, S, D, dtype=dtype)
    return q, k, v


def plain(score: Dot, q, k, v, **kwargs):
    """The unfused reference: masked float32 softmax over ``score.scores`` with kv heads repeated."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    return masked_softmax_attend(score.scores(q, k), v, **kwargs)


def test_scores_match_einsum_with_default_scale():
    q, k, _ = qkv()
    expected = torch.einsum("bhtd,bhsd->bhts", q, k)  # Luong: h_tᵀ h̄_s, no scaling
    torch.testing.assert_close(Dot(D, D, H).scores(q, k), expected)


def test_scores_match_einsum_with_scale_null():
    q, k, _ = qkv()
    expected = torch.einsum("bhtd,bhsd->bhts", q, k) / math.sqrt(D)
    torch.testing.assert_close(Dot(D, D, H, scale=None).scores(q, k), expected)


def test_scores_match_einsum_with_explicit_scale():
    q, k, _ = qkv()
    expected = 0.25 * torch.einsum("bhtd,bhsd->bhts", q, k)
    torch.testing.assert_close(Dot(D, D, H, scale=0.25).scores(q, k), expected)


def test_attend_matches_plain_path_with_random_mask():
    score, (q, k, v) = Dot(D, D, H), qkv()
    mask = torch.rand(B, 1, T, S) > 0.4
    torch.testing.assert_close(score.attend(q, k, v, mask=mask), plain(score, q, k, v, mask=mask))


def test_attend_matches_plain_path_when_causal():
    score, (q, k, v) = Dot(D, D, H), qkv()
    torch.testing.assert_close(score.attend(q, k, v, causal=True), plain(score, q, k, v, causal=True))


def test_attend_matches_plain_path_with_bias():
    score, (q, k, v) = Dot(D, D, H), qkv()
    bias = torch.randn(1, H, T, S)
    torch.testing.assert_close(score.attend(q, k, v, bias=bias), plain(score, q, k, v, bias=bias))


def test_attend_matches_plain_path_with_bias_when_causal():
    # T5 decoders: a relative-position bias on a causal stack; causality must survive the bias.
    score, (q, k, v) = Dot(D, D, H), qkv()
    bias = torch.randn(1, H, T, S)
    torch.testing.assert_close(score.attend(q, k, v, bias=bias, causal=True),
                               plain(score, q, k, v, bias=bias, causal=True))


def test_attend_matches_plain_path_with_bias_and_mask():
    score, (q, k, v) = Dot(D, D, H), qkv()
    bias, mask = torch.randn(B, 1, T, S), torch.rand(B, 1, T, S) > 0.4
    torch.testing.assert_close(score.attend(q, k, v, mask=mask, bias=bias),
                               plain(score, q, k, v, mask=mask, bias=bias))


def test_attend_matches_plain_path_with_grouped_kv_heads():
    score, (q, k, v) = Dot(D, D, H), qkv(kv_heads=K)
    mask = torch.rand(B, 1, T, S) > 0.4
    torch.testing.assert_close(score.attend(q, k, v, mask=mask), plain(score, q, k, v, mask=mask))


def test_attend_gives_zeros_for_fully_masked_rows():
    score, (q, k, v) = Dot(D, D, H), qkv()
    q.requires_grad_(True)
    mask = torch.rand(B, 1, T, S) > 0.4
    mask[0, :, 1] = False
    mask[1, :, 3] = False
    out = score.attend(q, k, v, mask=mask, bias=torch.randn(1, H, T, S))
    assert torch.equal(out[0, :, 1], torch.zeros(H, D))
    assert torch.equal(out[1, :, 3], torch.zeros(H, D))
    out.sum().backward()
    assert torch.isfinite(q.grad).all()


def test_attend_gradients_pass_gradcheck_in_float64():
    score = Dot(3, 3, 2)
    q = torch.randn(1, 2, 3, 3, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 1, 4, 3, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 1, 4, 3, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(1, 2, 3, 4, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[True, False, True, True]]).expand(3, 4)
    assert torch.autograd.gradcheck(
        lambda q, k, v, bias: score.attend(q, k, v, mask=mask, bias=bias), (q, k, v, bias))


def test_init_rejects_different_query_and_key_dims():
    with pytest.raises(ConfigError, match=r"score dot: query_dim=8 must equal key_dim=6.*bilinear"):
        Dot(8, 6, H)


def test_recipe_rejects_non_positive_scale():
    with pytest.raises(seqzoo.RecipeError, match=r"model\.attention\.score\.scale: -1\.0 is out of range"):
        seqzoo.build("tiny-gpt", ["model.attention.score={kind: dot, scale: -1}"], device="cpu")


def test_builds_from_recipe_and_cached_generation_matches_uncached():
    model = seqzoo.build("tiny-gpt", ["model.attention.score=dot"], device="cpu").eval()
    assert any(isinstance(m, Dot) for m in model.modules())
    ids = torch.randint(0, 256, (2, 6))
    with torch.no_grad():
        assert model(ids).shape == (2, 6, model.vocab_size)
    cached = seqzoo.generate(model, ids, 8, use_cache=True)
    uncached = seqzoo.generate(model, ids, 8, use_cache=False)
    assert torch.equal(cached, uncached)
