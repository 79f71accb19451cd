"""The ``bilinear`` score (Luong general, qᵀ W k per head): scores against a direct einsum of the
formula, the fused ``attend`` (W folded into q) against the plain masked-softmax path, gradients,
initialisation and a full model."""
from __future__ import annotations

import math

import torch

import seqzoo
from seqzoo.functional import masked_softmax_attend
from seqzoo.plugins.score.bilinear import Bilinear

# query_dim differs from key_dim (and the value dim from both), as in a recurrent seq2seq model.
B, H, K, T, S, DQ, DK, DV = 2, 4, 2, 5, 7, 6, 8, 3


def qkv(kv_heads: int = H, dtype: torch.dtype = torch.float32):
    q = torch.randn(B, H, T, DQ, dtype=dtype)
    k = torch.randn(B, kv_heads, S, DK, dtype=dtype)
    v = torch.randn(B, kv_heads, S, DV, dtype=dtype)
    return q, k, v


def random_bilinear(scale: float | None = 1.0, dtype: torch.dtype = torch.float32) -> Bilinear:
    """A bilinear score whose W is random (the identity init would hide a transposed W)."""
    score = Bilinear(DQ, DK, H, scale=scale).to(dtype)
    with torch.no_grad():
        score.weight.normal_(0.0, DQ ** -0.5)
    return score


def plain(score: Bilinear, q, k, v, **kwargs):
    """The unfused reference: masked softmax over ``score.scores`` with kv heads repeated."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    return masked_softmax_attend(score.scores(q, k), v, **kwargs)


def test_scores_match_einsum_with_default_scale():
    score, (q, k, _) = random_bilinear(), qkv()
    w = score.weight.detach()
    expected = torch.einsum("bhtd,hde,bhse->bhts", q, w, k)  # Σ_de q_d W_de k_e, per head
    torch.testing.assert_close(score.scores(q, k), expected)


def test_scores_match_per_head_matmul_with_scale_null():
    score, (q, k, _) = random_bilinear(scale=None), qkv()
    w = score.weight.detach()
    expected = torch.stack([q[:, h] @ w[h] @ k[:, h].transpose(-2, -1) for h in range(H)], dim=1)
    torch.testing.assert_close(score.scores(q, k), expected / math.sqrt(DK))


def test_attend_matches_plain_path_with_random_mask():
    score, (q, k, v) = random_bilinear(), qkv()
    mask = torch.rand(B, 1, T, S) > 0.4
    torch.testing.assert_close(score.attend(q, k, v, mask=mask), plain(score, q, k, v, mask=mask))


def test_attend_matches_plain_path_when_causal():
    score, (q, k, v) = random_bilinear(), qkv()
    torch.testing.assert_close(score.attend(q, k, v, causal=True), plain(score, q, k, v, causal=True))


def test_attend_matches_plain_path_with_bias():
    score, (q, k, v) = random_bilinear(), qkv()
    bias = torch.randn(1, H, T, S)
    torch.testing.assert_close(score.attend(q, k, v, bias=bias), plain(score, q, k, v, bias=bias))


def test_attend_matches_plain_path_with_bias_when_causal():
    score, (q, k, v) = random_bilinear(), qkv()
    bias = torch.randn(B, H, T, S)
    torch.testing.assert_close(score.attend(q, k, v, bias=bias, causal=True),
                               plain(score, q, k, v, bias=bias, causal=True))


def test_attend_matches_plain_path_with_grouped_kv_heads():
    score, (q, k, v) = random_bilinear(), qkv(kv_heads=K)
    mask = torch.rand(B, 1, T, S) > 0.4
    bias = torch.randn(1, H, T, S)
    torch.testing.assert_close(score.attend(q, k, v, mask=mask, bias=bias),
                               plain(score, q, k, v, mask=mask, bias=bias))


def test_attend_gives_zeros_for_fully_masked_rows():
    score, (q, k, v) = random_bilinear(), qkv()
    q.requires_grad_(True)
    mask = torch.rand(B, 1, T, S) > 0.4
    mask[0, :, 2] = False
    out = score.attend(q, k, v, mask=mask)
    assert torch.equal(out[0, :, 2], torch.zeros(H, DV))
    out.sum().backward()
    assert torch.isfinite(q.grad).all() and torch.isfinite(score.weight.grad).all()


def test_attend_gradients_pass_gradcheck_in_float64():
    score = Bilinear(2, 3, 2, scale=0.7).double()
    with torch.no_grad():
        score.weight.normal_()
    q = torch.randn(1, 2, 3, 2, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 1, 4, 3, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 1, 4, 2, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[True, False, True, True]]).expand(3, 4)
    # W is an input too: gradcheck perturbs it in place, and attend reads it from the module.
    assert torch.autograd.gradcheck(
        lambda q, k, v, w: score.attend(q, k, v, mask=mask, causal=False), (q, k, v, score.weight))


def test_init_starts_as_luong_dot_for_equal_dims():
    score = Bilinear(DK, DK, H)
    q, k = torch.randn(B, H, T, DK), torch.randn(B, H, S, DK)
    torch.testing.assert_close(score.scores(q, k), torch.einsum("bhtd,bhsd->bhts", q, k))
    assert score.weight.shape == (H, DK, DK)


def test_builds_from_recipe_and_cached_generation_matches_uncached():
    model = seqzoo.build("tiny-gpt", ["model.attention.score=bilinear"], device="cpu").eval()
    scores = [m for m in model.modules() if isinstance(m, Bilinear)]
    assert len(scores) == 4  # one per layer
    score = scores[0]
    # own_init: the model's N(0, 0.02) init leaves W at the identity it was built with.
    head_dim = score.key_dim
    torch.testing.assert_close(score.weight.detach(), torch.eye(head_dim).expand(score.heads, -1, -1))
    with torch.no_grad():
        for each in scores:  # a W that is not the identity, so the fold is exercised
            each.weight.normal_(0.0, head_dim ** -0.5)
    ids = torch.randint(0, 256, (2, 6))
    with torch.no_grad():
        assert model(ids).shape == (2, 6, model.vocab_size)
    cached = seqzoo.generate(model, ids, 8, use_cache=True)
    uncached = seqzoo.generate(model, ids, 8, use_cache=False)
    assert torch.equal(cached, uncached)
