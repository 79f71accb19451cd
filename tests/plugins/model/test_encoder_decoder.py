"""The encoder–decoder Transformer (Vaswani 2017, T5)."""
from __future__ import annotations

import pytest
import torch

import seqzoo


@pytest.mark.parametrize("recipe", ["tiny-transformer", "tiny-t5"])
def test_cached_generation_equals_uncached(recipe):
    model = seqzoo.build(recipe, device="cpu")
    src = torch.randint(0, 259, (3, 9))
    cached = seqzoo.generate(model, src, 12)
    assert cached.shape == (3, 13)
    assert torch.all(cached[:, 0] == model.decoder_start_id)
    assert torch.equal(cached, seqzoo.generate(model, src, 12, use_cache=False))


@pytest.mark.parametrize("recipe", ["tiny-transformer", "tiny-t5"])
def test_cached_decoding_logits_equal_teacher_forcing(recipe):
    model = seqzoo.build(recipe, device="cpu").eval()
    src, tgt = torch.randint(0, 259, (2, 7)), torch.randint(0, 259, (2, 6))
    with torch.no_grad():
        full = model(src, tgt)
        memory = model.encode(src)
        cache = model.new_cache(2, 6)
        steps = [model.decode(tgt[:, t:t + 1], memory, cache=cache) for t in range(6)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def test_decoder_is_causal_and_reads_the_source():
    model = seqzoo.build("tiny-transformer", device="cpu").eval()
    src, tgt = torch.randint(0, 259, (1, 7)), torch.randint(0, 259, (1, 6))
    with torch.no_grad():
        base = model(src, tgt)
        later = tgt.clone()
        later[0, 4:] = (tgt[0, 4:] + 1) % 259
        assert torch.equal(model(src, later)[:, :4], base[:, :4])
        other_src = (src + 1) % 259
        assert not torch.allclose(model(other_src, tgt)[:, 0], base[:, 0])


def test_source_padding_is_ignored():
    model = seqzoo.build("tiny-t5", device="cpu").eval()
    src, tgt = torch.randint(0, 256, (1, 5)), torch.randint(0, 259, (1, 4))
    padded = torch.cat([src, torch.full((1, 3), 256)], dim=1)
    mask = torch.tensor([[1, 1, 1, 1, 1, 0, 0, 0]])
    with torch.no_grad():
        torch.testing.assert_close(model(padded, tgt, src_mask=mask), model(src, tgt), atol=1e-5, rtol=1e-5)


def test_each_stack_owns_its_position_scheme_with_its_direction():
    model = seqzoo.build("tiny-t5", device="cpu")
    assert model.encoder.position is not model.decoder.position
    assert model.encoder.position.causal is False and model.decoder.position.causal is True


def test_t5_rescales_the_tied_head():
    model = seqzoo.build("tiny-t5", device="cpu").eval()
    hidden = torch.randn(1, 3, 64)
    torch.testing.assert_close(model.lm_head(hidden * 64 ** -0.5), hidden @ model.embed.weight.T * 0.125)
    assert model.head_scale == pytest.approx(0.125)


def test_decoder_start_id_outside_vocab_is_a_recipe_error():
    with pytest.raises(seqzoo.RecipeError, match=r"model\.decoder_start_id: 300 is not a token id \(vocab_size=259\)"):
        seqzoo.build("tiny-t5", ["model.decoder_start_id=300"], device="meta")
