"""The attention core: the fused scaled_dot path, masks, grouped heads, KV cache and causality."""
from __future__ import annotations

import math

import pytest
import torch

import seqzoo
from seqzoo.functional import expand_kv, masked_softmax_attend
from seqzoo.nn.attention import self_attention_inputs


def scaled_dot(d: int = 8, heads: int = 4):
    return seqzoo.registry().create("score", "scaled_dot", d, d, heads)


def reference_attention(q, k, v, allowed):
    """softmax(q kᵀ/√D) v written out, with rows that see nothing set to zero."""
    k, v = expand_kv(k, q.shape[1]), expand_kv(v, q.shape[1])
    logits = torch.einsum("bhtd,bhsd->bhts", q, k) / math.sqrt(q.shape[-1])
    logits = logits.masked_fill(~allowed, float("-inf"))
    weights = torch.nan_to_num(logits.softmax(-1), nan=0.0)
    return torch.einsum("bhts,bhsd->bhtd", weights, v)


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_fused_attend_equals_plain_path_with_random_mask(kv_heads):
    score = scaled_dot()
    q = torch.randn(2, 4, 5, 8)
    k, v = torch.randn(2, kv_heads, 7, 8), torch.randn(2, kv_heads, 7, 8)
    mask = torch.rand(2, 1, 5, 7) > 0.3
    fused = score.attend(q, k, v, mask=mask)
    plain = masked_softmax_attend(score.scores(q, expand_kv(k, 4)), expand_kv(v, 4), mask=mask)
    torch.testing.assert_close(fused, plain, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(fused, reference_attention(q, k, v, mask.expand(2, 4, 5, 7)), atol=1e-6, rtol=1e-5)


def test_fused_attend_equals_plain_path_causal_and_bias():
    score = scaled_dot()
    q, k, v = torch.randn(3, 1, 4, 6, 8).unbind(0)
    bias = torch.randn(1, 4, 6, 6)
    fused = score.attend(q, k, v, bias=bias, causal=True)
    plain = masked_softmax_attend(score.scores(q, k), v, bias=bias, causal=True)
    torch.testing.assert_close(fused, plain, atol=1e-6, rtol=1e-5)
    # The base-class default attend is the plain path.
    torch.testing.assert_close(seqzoo.interfaces.ScoreFunction.attend(score, q, k, v, bias=bias, causal=True),
                               plain, atol=1e-6, rtol=1e-5)


def test_fully_masked_rows_give_zeros_not_nan():
    score = scaled_dot()
    q, k, v = torch.randn(3, 1, 4, 3, 8).unbind(0)
    mask = torch.ones(1, 1, 3, 3, dtype=torch.bool)
    mask[..., 1, :] = False
    for out in (score.attend(q, k, v, mask=mask),
                seqzoo.interfaces.ScoreFunction.attend(score, q, k, v, mask=mask),
                score.attend(q, k, v, mask=mask, bias=torch.randn(1, 4, 3, 3))):
        assert not out.isnan().any()
        assert torch.all(out[:, :, 1] == 0)


def test_expand_kv_maps_query_head_to_group():
    k = torch.arange(2).float().view(1, 2, 1, 1)  # kv head values 0, 1
    assert expand_kv(k, 6).flatten().tolist() == [0, 0, 0, 1, 1, 1]


def test_sliding_window_mask_counts_window_keys_per_row():
    position = seqzoo.registry().create("position", "none", 8, 2, 4, 32)
    inputs = self_attention_inputs(position, torch.arange(10)[None], causal=True, window=3)
    counts = inputs.mask[0, 0].sum(-1).tolist()
    assert counts == [min(i + 1, 3) for i in range(10)]


def test_mask_with_cache_is_bottom_right_aligned():
    position = seqzoo.registry().create("position", "none", 8, 2, 4, 32)
    cache = seqzoo.nn.cache.DecodeCache([], 1, 16)
    cache.length = 5
    inputs = self_attention_inputs(position, torch.arange(5, 8)[None], causal=True, cache=cache)
    assert inputs.mask[0, 0].sum(-1).tolist() == [6, 7, 8]


def test_causality_later_tokens_never_change_earlier_logits(tiny_gpt):
    ids = torch.randint(0, 259, (2, 12))
    changed = ids.clone()
    changed[:, 8:] = torch.randint(0, 259, (2, 4))
    with torch.no_grad():
        a, b = tiny_gpt(ids), tiny_gpt(changed)
    torch.testing.assert_close(a[:, :8], b[:, :8], atol=0, rtol=0)
    assert not torch.allclose(a[:, 8:], b[:, 8:])


@pytest.mark.parametrize("overrides", [
    [],
    ["model.position=sinusoidal"],
    ["model.position=rope"],
    ["model.position=none"],
    ["model.attention.kv_heads=2"],
    ["model.attention.kv_heads=1", "model.position=rope"],
    ["model.attention.window=4"],
    ["model.placement=post"],
    ["model.norm=rmsnorm", "model.ffn=relu", "model.tie_embeddings=false"],
])
def test_cached_decoding_equals_full_forward(overrides):
    model = seqzoo.build("tiny-gpt", overrides, device="cpu").eval()
    ids = torch.randint(0, 259, (2, 11))
    with torch.no_grad():
        full = model(ids)
        cache = model.new_cache(2, 11)
        steps = [model(ids[:, :3], cache=cache)]  # a 3-token prefill, then one token at a time
        steps += [model(ids[:, t:t + 1], cache=cache) for t in range(3, 11)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def test_chunked_prefill_with_cache_equals_full_forward():
    model = seqzoo.build("tiny-gpt", ["model.attention.window=3", "model.position=rope"], device="cpu").eval()
    ids = torch.randint(0, 259, (1, 12))
    with torch.no_grad():
        full = model(ids)
        cache = model.new_cache(1, 12)
        chunks = [model(ids[:, i:i + 4], cache=cache) for i in range(0, 12, 4)]
    torch.testing.assert_close(torch.cat(chunks, dim=1), full, atol=1e-5, rtol=1e-5)


def test_cache_overflow_is_a_clear_error(tiny_gpt):
    cache = tiny_gpt.new_cache(1, 4)
    with pytest.raises(seqzoo.InputError, match=r"decode cache full: 0 cached \+ 5 new tokens > max_len=4"):
        tiny_gpt(torch.zeros(1, 5, dtype=torch.long), cache=cache)


def test_learned_positions_past_the_table_is_a_clear_error(tiny_gpt):
    with pytest.raises(seqzoo.InputError, match=r"sequence of 257 tokens exceeds the 256 positions"):
        tiny_gpt(torch.zeros(1, 257, dtype=torch.long))


def test_left_padding_does_not_change_real_token_logits(tiny_gpt):
    ids = torch.randint(0, 256, (1, 6))
    padded = torch.cat([torch.full((1, 3), 256), ids], dim=1)
    mask = torch.cat([torch.zeros(1, 3), torch.ones(1, 6)], dim=1).long()
    with torch.no_grad():
        alone = tiny_gpt(ids)
        batched = tiny_gpt(padded, attention_mask=mask)
    torch.testing.assert_close(batched[:, 3:], alone, atol=1e-5, rtol=1e-5)


def test_masked_softmax_attend_reads_grouped_values_like_expand_kv():
    """v with K < H heads: query head h reads v head h // (H // K), the same as expanding v."""
    torch.manual_seed(3)
    logits, v = torch.randn(2, 6, 5, 7), torch.randn(2, 2, 7, 4)
    mask = torch.rand(2, 1, 5, 7) > 0.3
    bias = torch.randn(1, 6, 5, 7)
    torch.testing.assert_close(masked_softmax_attend(logits, v, mask=mask, bias=bias),
                               masked_softmax_attend(logits, expand_kv(v, 6), mask=mask, bias=bias))
