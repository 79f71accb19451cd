"""Generating a list of prompts of different lengths in one padded batch gives, for each prompt,
exactly what generating it alone gives — for every architecture."""
from __future__ import annotations

import pytest
import torch

import seqzoo

RECIPES = ["tiny-gpt", "tiny-llama", "tiny-mistral", "tiny-bloom", "tiny-t5", "tiny-transformer",
           "tiny-seq2seq", "rnn-lm"]


def prompts(n: int = 32, seed: int = 1) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 14, (n,), generator=generator).tolist()
    return [torch.randint(0, 256, (length,), generator=generator) for length in lengths]


@pytest.mark.parametrize("recipe", RECIPES)
def test_batched_list_equals_each_prompt_alone(recipe):
    overrides = ["model.dim=32", "model.hidden=32"] if recipe == "rnn-lm" else []
    model = seqzoo.build(recipe, overrides, device="cpu")
    batch = prompts()
    together = seqzoo.generate(model, batch, 8)
    assert isinstance(together, list) and len(together) == len(batch)
    for prompt, out in zip(batch, together):
        alone = seqzoo.generate(model, prompt, 8)[0]
        assert torch.equal(out, alone)
        if not hasattr(model, "encode"):
            assert torch.equal(out[: len(prompt)], prompt)  # the prompt, unpadded, then new tokens


@pytest.mark.parametrize("position", ["alibi", "t5", "rope", "sinusoidal", "xl", "shaw"])
def test_batched_list_equals_alone_for_every_position_scheme(position):
    model = seqzoo.build("tiny-gpt", [f"model.position={position}"], device="cpu")
    batch = prompts(12, seed=2)
    for prompt, out in zip(batch, seqzoo.generate(model, batch, 6)):
        assert torch.equal(out, seqzoo.generate(model, prompt, 6)[0])


def test_outputs_end_at_eos_without_padding():
    model = seqzoo.build("tiny-gpt", device="cpu")
    batch = prompts(6, seed=3)
    free = seqzoo.generate(model, batch, 8)
    eos = int(free[0][len(batch[0]) + 2])  # the third token the first prompt produces
    outs = seqzoo.generate(model, batch, 8, eos_id=eos)
    first = outs[0][len(batch[0]):]
    assert int(first[-1]) == eos and (first == eos).sum() == 1 and len(first) <= 3
    for prompt, out in zip(batch, outs):
        new = out[len(prompt):]
        assert (new == eos).sum() <= 1 and (len(new) == 8 or int(new[-1]) == eos)


def test_beam_search_on_a_list():
    model = seqzoo.build("tiny-t5", device="cpu")
    batch = prompts(5, seed=4)
    for prompt, out in zip(batch, seqzoo.generate(model, batch, 5, beam_size=3)):
        assert torch.equal(out, seqzoo.generate(model, prompt, 5, beam_size=3)[0])


def test_bad_prompt_in_the_list_is_a_clear_error():
    model = seqzoo.build("tiny-gpt", device="cpu")
    with pytest.raises(seqzoo.InputError, match=r"prompt 1: each prompt must be a non-empty 1-D tensor"):
        seqzoo.generate(model, [torch.tensor([1, 2]), torch.zeros(2, 2, dtype=torch.long)], 3)
