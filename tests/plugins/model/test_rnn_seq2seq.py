"""The recurrent Seq2Seq model: every attention score, padding, teacher forcing, decoding."""
from __future__ import annotations

import pytest
import torch

import seqzoo

ATTENTIONS = ["none", "additive", "dot", "bilinear", "scaled_dot", "cosine"]


def build(attention: str = "additive", *extra: str):
    return seqzoo.build("tiny-seq2seq", [f"model.attention={attention}", *extra], device="cpu").eval()


@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("bidirectional", ["false", "true"])
def test_builds_runs_and_cached_greedy_equals_uncached(attention, bidirectional):
    model = build(attention, f"model.bidirectional={bidirectional}")
    src, tgt = torch.randint(0, 256, (3, 7)), torch.randint(0, 256, (3, 5))
    with torch.no_grad():
        assert model(src, tgt).shape == (3, 5, 259)
    cached = seqzoo.generate(model, src, 6, eos_id=None)  # a fixed length: random weights may say eos
    assert cached.shape == (3, 7) and torch.all(cached[:, 0] == 257)
    assert torch.equal(cached, seqzoo.generate(model, src, 6, use_cache=False, eos_id=None))


@pytest.mark.parametrize("attention", ["additive", "bilinear", "dot"])
def test_attention_weights_sum_to_one_over_real_positions_and_zero_on_padding(attention):
    model = build(attention, "model.bidirectional=true")
    src, tgt = torch.randint(0, 256, (2, 8)), torch.randint(0, 256, (2, 4))
    lengths = torch.tensor([8, 5])
    with torch.no_grad():
        model(src, tgt, src_lengths=lengths)
    weights = model.last_alignment  # (B, T, S)
    assert weights.shape == (2, 4, 8)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4))
    assert torch.all(weights[1, :, 5:] == 0)


@pytest.mark.parametrize("attention", ["none", "additive"])
def test_source_padding_never_changes_the_output(attention):
    model = build(attention, "model.bidirectional=true")
    src, tgt = torch.randint(0, 256, (1, 5)), torch.randint(0, 256, (1, 4))
    padded = torch.cat([src, torch.full((1, 3), 256)], dim=1)
    with torch.no_grad():
        alone = model(src, tgt)
        batched = model(padded, tgt, src_lengths=torch.tensor([5]))
    torch.testing.assert_close(batched, alone, atol=1e-5, rtol=1e-5)


def test_no_attention_links_only_through_the_final_state():
    """Without attention the decoder sees the source only through the encoder's final state."""
    model = build("none")
    src = torch.randint(0, 256, (1, 6))
    with torch.no_grad():
        memory, _, state = model.encode(src)
        _, states = model.encoder(model.embed(src))
    torch.testing.assert_close(state[0], states[0][0])
    torch.testing.assert_close(memory[:, -1], state[0])


def test_teacher_forced_fused_path_equals_step_loop():
    model = build("none")
    src, tgt = torch.randint(0, 256, (2, 6)), torch.randint(0, 256, (2, 5))
    with torch.no_grad():
        fused = model(src, tgt)
        memory, mask, state = model.encode(src)
        steps = []
        for t in range(5):
            logits, state, _ = model.step(tgt[:, t], state, memory, mask)
            steps.append(logits)
    torch.testing.assert_close(torch.stack(steps, 1), fused, atol=1e-5, rtol=1e-5)


def test_teacher_forcing_below_one_feeds_back_own_predictions_while_training():
    model = build("additive", "model.teacher_forcing=0.0").train()
    src, tgt = torch.randint(0, 256, (2, 6)), torch.randint(0, 256, (2, 5))
    other = tgt.clone()
    other[:, 1:] = (tgt[:, 1:] + 1) % 256
    # With ratio 0 only the first (start) token of the target is ever read.
    torch.testing.assert_close(model(src, tgt), model(src, other))
    model.eval()  # evaluation always teacher-forces
    assert not torch.allclose(model(src, tgt), model(src, other))


def test_sampling_and_beam_search_decode():
    model = build("additive")
    src = torch.randint(0, 256, (2, 6))
    sampled = seqzoo.generate(model, src, 5, temperature=1.0, seed=1)
    assert torch.equal(sampled, seqzoo.generate(model, src, 5, temperature=1.0, seed=1))
    assert torch.equal(seqzoo.generate(model, src, 5, beam_size=1), seqzoo.generate(model, src, 5))
    assert seqzoo.generate(model, src, 5, beam_size=3, eos_id=258).shape[0] == 2


def test_unknown_attention_suggests_a_score():
    with pytest.raises(seqzoo.RecipeError, match=r"model\.attention: unknown score 'addtive'; did you mean "
                                                 r"'additive'\?"):
        build("addtive")


def test_gradients_reach_the_encoder_through_attention():
    model = build("additive").train()
    src, tgt = torch.randint(0, 256, (2, 6)), torch.randint(0, 256, (2, 5))
    model.loss(model(src, tgt), tgt).backward()
    assert model.encoder.cells[0][0].weight_ih.grad.abs().sum() > 0
    assert model.attention.query_weight.grad.abs().sum() > 0
