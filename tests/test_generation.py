"""Generation: cached == uncached, sampling controls, EOS handling."""
from __future__ import annotations

import pytest
import torch

import seqzoo
from seqzoo.nn.generation import choose


@pytest.mark.parametrize("overrides", [[], ["model.position=rope"], ["model.attention.kv_heads=1"],
                                       ["model.attention.window=5"], ["model.position=sinusoidal"],
                                       ["model.position=hard_alibi"]])
def test_cached_and_uncached_greedy_are_identical(overrides):
    model = seqzoo.build("tiny-gpt", overrides, device="cpu")
    ids = torch.randint(0, 259, (3, 7))
    cached = seqzoo.generate(model, ids, 20)
    uncached = seqzoo.generate(model, ids, 20, use_cache=False)
    assert cached.shape == (3, 27)
    assert torch.equal(cached, uncached)
    assert torch.equal(cached[:, :7], ids)


def test_sampling_is_reproducible_with_a_seed(tiny_gpt):
    ids = torch.randint(0, 259, (2, 4))
    a = seqzoo.generate(tiny_gpt, ids, 10, temperature=1.0, seed=3)
    b = seqzoo.generate(tiny_gpt, ids, 10, temperature=1.0, seed=3)
    c = seqzoo.generate(tiny_gpt, ids, 10, temperature=1.0, seed=4)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_top_k_one_equals_greedy(tiny_gpt):
    ids = torch.randint(0, 259, (2, 4))
    assert torch.equal(seqzoo.generate(tiny_gpt, ids, 8, temperature=1.0, top_k=1, seed=0),
                       seqzoo.generate(tiny_gpt, ids, 8))


def test_top_p_keeps_the_smallest_set_holding_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    generator = torch.Generator().manual_seed(0)
    picks = {choose(logits, temperature=1.0, top_k=None, top_p=0.7, generator=generator).item()
             for _ in range(200)}
    assert picks == {0, 1}


def test_top_k_excludes_the_rest():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0]])
    generator = torch.Generator().manual_seed(0)
    picks = {choose(logits, temperature=2.0, top_k=2, top_p=None, generator=generator).item()
             for _ in range(200)}
    assert picks == {0, 1}


def test_eos_stops_and_pads_finished_rows(tiny_gpt):
    ids = torch.randint(0, 259, (2, 4))
    greedy = seqzoo.generate(tiny_gpt, ids, 6)
    eos = int(greedy[0, 5])  # the second token row 0 generates
    out = seqzoo.generate(tiny_gpt, ids, 6, eos_id=eos)
    row0 = out[0, 4:].tolist()
    assert row0[1] == eos and all(t == eos for t in row0[1:])


def test_generate_restores_training_mode(tiny_gpt):
    tiny_gpt.train()
    seqzoo.generate(tiny_gpt, torch.zeros(1, 2, dtype=torch.long), 2)
    assert tiny_gpt.training


@pytest.mark.parametrize("kwargs, message", [
    ({"temperature": -1.0}, "temperature must be a finite number >= 0"),
    ({"temperature": float("nan")}, "temperature must be a finite number >= 0, got nan"),
    ({"temperature": float("inf")}, "temperature must be a finite number >= 0, got inf"),
    ({"beam_size": 2, "length_penalty": float("nan")}, "length_penalty must be a finite number, got nan"),
    ({"top_k": 0}, "top_k must be >= 1"),
    ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
])
def test_bad_sampling_arguments_are_clear_errors(tiny_gpt, kwargs, message):
    with pytest.raises(seqzoo.InputError, match=message):
        seqzoo.generate(tiny_gpt, torch.zeros(1, 2, dtype=torch.long), 2, **kwargs)


def test_empty_prompt_is_a_clear_error(tiny_gpt):
    with pytest.raises(seqzoo.InputError, match=r"input_ids must be \(B, T\) with T >= 1"):
        seqzoo.generate(tiny_gpt, torch.zeros(1, 0, dtype=torch.long), 2)


def test_one_dim_prompt_is_treated_as_a_batch_of_one(tiny_gpt):
    out = seqzoo.generate(tiny_gpt, torch.tensor([1, 2, 3]), 4)
    assert out.shape == (1, 7)


def test_generated_ids_feed_straight_into_a_training_step(tiny_gpt):
    """generate runs under inference_mode but hands back ordinary tensors."""
    out = seqzoo.generate(tiny_gpt, torch.tensor([[72, 105]]), 6)
    listed = seqzoo.generate(tiny_gpt, [torch.tensor([1, 2]), torch.tensor([3])], 3)
    assert not out.is_inference() and not any(row.is_inference() for row in listed)
    tiny_gpt.train()
    tiny_gpt(out[:, :-1], targets=out[:, 1:]).backward()
    assert tiny_gpt.embed.weight.grad is not None


# -- the first hour: defaults and limits a new user meets ----------------------------------------------
def _eos_first(model: torch.nn.Module) -> torch.nn.Module:
    """Make the tokenizer's eos (258 for bytes) the most likely next token everywhere."""
    bias = torch.zeros(259)
    bias[258] = 1e4
    model.lm_head.bias = torch.nn.Parameter(bias)
    return model


def test_generate_stops_at_the_tokenizers_eos_by_default(tiny_gpt):
    model = _eos_first(tiny_gpt)
    ids = torch.tensor([[104, 105], [106, 107]])
    out = seqzoo.generate(model, ids, 10)
    assert out.tolist() == [[104, 105, 258], [106, 107, 258]]  # stopped: every row ended
    never = seqzoo.generate(model, ids, 10, eos_id=None)  # an explicit None never stops
    assert never.shape == (2, 12) and (never[:, 2:] == 258).all()


def test_generate_list_default_eos_cuts_each_answer(tiny_gpt):
    model = _eos_first(tiny_gpt)
    outs = seqzoo.generate(model, [torch.tensor([1, 2, 3]), torch.tensor([4])], 5)
    assert [o.tolist() for o in outs] == [[1, 2, 3, 258], [4, 258]]


def test_generate_stops_at_the_learned_position_limit_with_a_warning(tiny_gpt):
    ids = torch.randint(0, 256, (1, 250))
    with pytest.warns(UserWarning, match=r"stopping after 7 new tokens instead of 20: a 250-token prompt leaves "
                                         r"room for 7 before the model's 256-position limit"):
        out = seqzoo.generate(tiny_gpt, ids, 20, eos_id=None)
    assert out.shape == (1, 257)
    assert torch.equal(out, seqzoo.generate(tiny_gpt, ids, 7, eos_id=None))  # the same tokens, no loss


def test_generate_refuses_a_prompt_longer_than_the_position_table(tiny_gpt):
    with pytest.raises(seqzoo.InputError, match=r"the prompt has 300 tokens but the model reads at most 256 "
                                                r"positions"):
        seqzoo.generate(tiny_gpt, torch.zeros(1, 300, dtype=torch.long), 4)


def test_beam_search_refuses_sampling_options(tiny_gpt):
    for options in ({"temperature": 0.7}, {"top_k": 5}, {"top_p": 0.9}):
        with pytest.raises(seqzoo.InputError, match=r"beam search \(beam_size=3\) keeps the most likely "
                                                    r"hypotheses and does not sample"):
            seqzoo.generate(tiny_gpt, torch.tensor([[1, 2]]), 4, beam_size=3, **options)


def test_cli_generate_past_the_limit_keeps_its_output(tmp_path, capsys):
    from seqzoo.cli import main

    ckpt = seqzoo.save(seqzoo.build("tiny-gpt", device="cpu"), tmp_path / "m.safetensors")
    assert main(["generate", str(ckpt), "--ids", ",".join(["97"] * 250), "--max-new-tokens", "20"]) == 0
    captured = capsys.readouterr()
    assert len(captured.out.strip().split(",")) <= 257
    assert captured.err.startswith("seqzoo: warning: stopping after 7 new tokens instead of 20")
