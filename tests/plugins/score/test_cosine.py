"""The ``cosine`` score (Swin V2 scaled cosine attention): scores against a direct einsum of the
formula, the fused ``attend`` against the plain masked-softmax path, gradients (ℓ included), the
temperature clamp and initialisation, and a full model."""
from __future__ import annotations

import math

import pytest
import torch

import seqzoo
from seqzoo.errors import ConfigError
from seqzoo.functional import masked_softmax_attend
from seqzoo.plugins.score.cosine import Cosine

B, H, K, T, S, D = 2, 4, 2, 5, 7, 8


def qkv(kv_heads: int = H, dtype: torch.dtype = torch.float32):
    q = torch.randn(B, H, T, D, dtype=dtype)
    k = torch.randn(B, kv_heads, S, D, dtype=dtype)
    v = torch.randn(B, kv_heads, S, D, dtype=dtype)
    return q, k, v


def random_cosine() -> Cosine:
    """A cosine score with a different log-temperature per head (one beyond the clamp)."""
    score = Cosine(D, D, H)
    with torch.no_grad():
        score.logit_scale.copy_(torch.tensor([math.log(10.0), 0.3, -1.0, 6.0]).view(H, 1, 1))
    return score


def reference_scores(q, k, log_scale):
    """(q/‖q‖)·(k/‖k‖) · exp(min(ℓ, ln 100)), written out from Swin V2."""
    qn = q / q.pow(2).sum(-1, keepdim=True).sqrt()
    kn = k / k.pow(2).sum(-1, keepdim=True).sqrt()
    temperature = torch.minimum(log_scale, torch.tensor(math.log(100.0))).exp()
    return torch.einsum("bhtd,bhsd->bhts", qn, kn) * temperature.view(1, -1, 1, 1)


def plain(score: Cosine, q, k, v, **kwargs):
    """The unfused reference: masked softmax over ``score.scores`` with kv heads repeated."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    return masked_softmax_attend(score.scores(q, k), v, **kwargs)


def test_scores_match_einsum_with_per_head_temperature():
    score, (q, k, _) = random_cosine(), qkv()
    expected = reference_scores(q, k, score.logit_scale.detach().view(H))
    torch.testing.assert_close(score.scores(q, k), expected)


def test_scores_clamp_temperature_at_100():
    score, (q, k, _) = random_cosine(), qkv()
    cos = torch.nn.functional.cosine_similarity(q[:, 3, :, None], k[:, 3, None], dim=-1)
    torch.testing.assert_close(score.scores(q, k)[:, 3], 100.0 * cos)  # ℓ = 6 > ln 100


def test_init_sets_temperature_to_ln_10():
    score = Cosine(D, D, H)
    assert score.logit_scale.shape == (H, 1, 1)
    torch.testing.assert_close(score.logit_scale.detach(), torch.full((H, 1, 1), math.log(10.0)))


def test_attend_matches_plain_path_with_random_mask():
    score, (q, k, v) = random_cosine(), qkv()
    mask = torch.rand(B, 1, T, S) > 0.4
    torch.testing.assert_close(score.attend(q, k, v, mask=mask), plain(score, q, k, v, mask=mask))


def test_attend_matches_plain_path_when_causal():
    score, (q, k, v) = random_cosine(), qkv()
    torch.testing.assert_close(score.attend(q, k, v, causal=True), plain(score, q, k, v, causal=True))


def test_attend_matches_plain_path_with_bias():
    score, (q, k, v) = random_cosine(), qkv()
    bias = 16 * torch.sigmoid(torch.randn(1, H, T, S))  # Swin V2's bias range
    torch.testing.assert_close(score.attend(q, k, v, bias=bias), plain(score, q, k, v, bias=bias))


def test_attend_matches_plain_path_with_bias_when_causal():
    score, (q, k, v) = random_cosine(), qkv()
    bias = torch.randn(1, H, T, S)
    torch.testing.assert_close(score.attend(q, k, v, bias=bias, causal=True),
                               plain(score, q, k, v, bias=bias, causal=True))


def test_attend_matches_plain_path_with_grouped_kv_heads():
    score, (q, k, v) = random_cosine(), qkv(kv_heads=K)
    mask = torch.rand(B, 1, T, S) > 0.4
    torch.testing.assert_close(score.attend(q, k, v, mask=mask), plain(score, q, k, v, mask=mask))


def test_attend_gives_zeros_for_fully_masked_rows():
    score, (q, k, v) = random_cosine(), qkv()
    q.requires_grad_(True)
    mask = torch.rand(B, 1, T, S) > 0.4
    mask[1, :, 0] = False
    out = score.attend(q, k, v, mask=mask, bias=torch.randn(1, H, T, S))
    assert torch.equal(out[1, :, 0], torch.zeros(H, D))
    out.sum().backward()
    assert torch.isfinite(q.grad).all() and torch.isfinite(score.logit_scale.grad).all()


def test_attend_gradients_pass_gradcheck_in_float64():
    score = Cosine(3, 3, 2).double()
    with torch.no_grad():
        score.logit_scale.copy_(torch.tensor([0.5, 1.2], dtype=torch.float64).view(2, 1, 1))
    q = torch.randn(1, 2, 3, 3, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 1, 4, 3, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 1, 4, 3, dtype=torch.float64, requires_grad=True)
    # ℓ is an input too: gradcheck perturbs it in place, and attend reads it from the module.
    assert torch.autograd.gradcheck(
        lambda q, k, v, ell: score.attend(q, k, v, causal=True), (q, k, v, score.logit_scale))


def test_init_rejects_different_query_and_key_dims():
    with pytest.raises(ConfigError, match=r"score cosine: query_dim=8 must equal key_dim=6.*bilinear"):
        Cosine(8, 6, H)


def test_builds_from_recipe_and_cached_generation_matches_uncached():
    model = seqzoo.build("tiny-gpt", ["model.attention.score=cosine"], device="cpu").eval()
    scores = [m for m in model.modules() if isinstance(m, Cosine)]
    assert len(scores) == 4  # one per layer
    score = scores[0]
    # own_init: the model's weight init leaves ℓ at ln 10.
    torch.testing.assert_close(score.logit_scale.detach(), torch.full((score.heads, 1, 1), math.log(10.0)))
    ids = torch.randint(0, 256, (2, 6))
    with torch.no_grad():
        assert model(ids).shape == (2, 6, model.vocab_size)
    cached = seqzoo.generate(model, ids, 8, use_cache=True)
    uncached = seqzoo.generate(model, ids, 8, use_cache=False)
    assert torch.equal(cached, uncached)
