"""The recurrent LM and its classification and regression heads."""
from __future__ import annotations

import pytest
import torch

import seqzoo


def build(*overrides: str):
    return seqzoo.build("rnn-lm", ["model.dim=16", "model.hidden=24", *overrides], device="cpu").eval()


@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn"])
def test_lm_logits_cached_generation_equals_uncached(cell):
    model = build(f"model.cell={cell}")
    ids = torch.randint(0, 256, (2, 6))
    with torch.no_grad():
        assert model(ids).shape == (2, 6, 259)
    assert torch.equal(seqzoo.generate(model, ids, 8), seqzoo.generate(model, ids, 8, use_cache=False))


def test_lm_is_causal():
    model = build()
    ids = torch.randint(0, 256, (1, 8))
    changed = ids.clone()
    changed[0, 5:] = (ids[0, 5:] + 1) % 256
    with torch.no_grad():
        assert torch.equal(model(ids)[:, :5], model(changed)[:, :5])


def test_last_head_reads_the_last_real_state():
    model = build("model.head=last", "model.num_classes=3")
    ids = torch.randint(0, 256, (1, 5))
    padded = torch.cat([ids, torch.zeros(1, 4, dtype=torch.long)], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(model(padded, lengths=torch.tensor([5])), model(ids), atol=1e-6, rtol=1e-5)
        assert model(ids).shape == (1, 3)


def test_mean_head_averages_real_states_only():
    model = build("model.head=mean", "model.num_classes=2")
    ids = torch.randint(0, 256, (1, 4))
    padded = torch.cat([ids, torch.zeros(1, 3, dtype=torch.long)], dim=1)
    with torch.no_grad():
        hidden, _ = model.rnn(model.embed(ids))
        expected = model.head(hidden.mean(1))
        torch.testing.assert_close(model(padded, lengths=torch.tensor([4])), expected, atol=1e-6, rtol=1e-5)


def test_regression_head_uses_mse():
    model = build("model.head=regression", "model.num_classes=2")
    ids = torch.randint(0, 256, (3, 5))
    out = model(ids)
    target = torch.randn(3, 2)
    torch.testing.assert_close(model.loss(out, target), ((out - target) ** 2).mean())


def test_lm_loss_ignores_padded_steps():
    model = build()
    ids = torch.randint(0, 256, (2, 6))
    logits = model(ids)
    lengths = torch.tensor([6, 3])
    expected = torch.nn.functional.cross_entropy(
        torch.cat([logits[0], logits[1, :3]]), torch.cat([ids[0], ids[1, :3]]))
    torch.testing.assert_close(model.loss(logits, ids, lengths), expected)


def test_classification_head_needs_num_classes():
    with pytest.raises(seqzoo.RecipeError, match=r"model\.num_classes: head 'last' classifies sequences: set "
                                                 r"num_classes"):
        build("model.head=last")


def test_tying_needs_equal_widths():
    with pytest.raises(seqzoo.RecipeError, match=r"model\.tie_embeddings: tying needs dim == hidden"):
        build("model.tie_embeddings=true")


def test_generation_needs_the_lm_head():
    model = build("model.head=last", "model.num_classes=2")
    with pytest.raises(seqzoo.InputError, match="generation needs head 'lm'"):
        seqzoo.generate(model, torch.zeros(1, 2, dtype=torch.long), 2)
