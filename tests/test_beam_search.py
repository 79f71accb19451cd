"""Beam search: exact on a hand-made Markov chain, beam 1 == greedy on real models, EOS and length
normalisation."""
from __future__ import annotations

import itertools
import math

import pytest
import torch

import seqzoo
from seqzoo.interfaces import LanguageModel


class MarkovChain(LanguageModel):
    """A 'model' whose next-token distribution depends only on the last token: table[last]. It
    implements only what the LanguageModel contract asks of a generating model."""

    def __init__(self, table: torch.Tensor, start: int = 0) -> None:
        super().__init__()
        self.log_table = table.log()
        self.start = start

    def start_generation(self, input_ids, max_new_tokens, use_cache=True, attention_mask=None):
        chain = self

        class Session:
            prefix = input_ids

            def __init__(self):
                self.last = input_ids[:, -1]

            def next(self, tokens):
                if tokens is not None:
                    self.last = tokens
                return chain.log_table[self.last]

            def reorder(self, rows):
                self.last = self.last.index_select(0, rows)

        return Session()


def best_sequence(table: torch.Tensor, start: int, length: int) -> tuple[list[int], float]:
    """Exhaustive search: the most likely sequence of ``length`` tokens after ``start``."""
    best, best_score = None, -math.inf
    for seq in itertools.product(range(table.shape[0]), repeat=length):
        score, last = 0.0, start
        for token in seq:
            score += math.log(table[last, token])
            last = token
        if score > best_score:
            best, best_score = list(seq), score
    return best, best_score


def test_beam_search_finds_what_greedy_misses():
    # From 0, token 1 looks best (0.6) but leads to a flat distribution; token 2 (0.4) leads to a
    # near-certain next token: 0.4·0.95 > 0.6·0.34.
    table = torch.tensor([[0.0001, 0.6, 0.3999],
                          [0.33, 0.34, 0.33],
                          [0.025, 0.025, 0.95]])
    model = MarkovChain(table)
    prompt = torch.tensor([[0]])
    greedy = seqzoo.generate(model, prompt, 2)
    beam = seqzoo.generate(model, prompt, 2, beam_size=2)
    expected, _ = best_sequence(table, 0, 2)
    assert greedy[0, 1:].tolist() == [1, 1]
    assert beam[0, 1:].tolist() == expected == [2, 2]


def test_beam_search_matches_exhaustive_search_on_random_chains():
    generator = torch.Generator().manual_seed(1)
    for _ in range(5):
        table = torch.rand(4, 4, generator=generator).softmax(-1)
        expected, _ = best_sequence(table, 0, 3)
        beam = seqzoo.generate(MarkovChain(table), torch.tensor([[0]]), 3, beam_size=16)
        assert beam[0, 1:].tolist() == expected


def test_eos_finishes_hypotheses_and_length_penalty_ranks_them():
    # Token 2 is EOS. Ending right away costs log 0.5; going on through token 1 costs log 0.5 per
    # step plus log 0.9 for the EOS — longer sequences win only once length is normalised.
    table = torch.tensor([[0.0, 0.5, 0.5],
                          [0.0, 0.1, 0.9],
                          [0.0, 0.0, 1.0]]).clamp(min=1e-9)
    model = MarkovChain(table)
    prompt = torch.tensor([[0]])
    short = seqzoo.generate(model, prompt, 4, beam_size=3, eos_id=2, length_penalty=0.0)
    assert short[0, 1:].tolist()[0] == 2  # raw log-probability prefers stopping at once
    normalised = seqzoo.generate(model, prompt, 4, beam_size=3, eos_id=2, length_penalty=2.0)
    assert normalised[0, 1:3].tolist() == [1, 2]  # log(0.45)/4 > log(0.5)/1


@pytest.mark.parametrize("recipe", ["tiny-gpt", "tiny-t5", "tiny-llama"])
def test_beam_one_equals_greedy(recipe):
    model = seqzoo.build(recipe, device="cpu")
    ids = torch.randint(0, 256, (3, 5))
    assert torch.equal(seqzoo.generate(model, ids, 8, beam_size=1), seqzoo.generate(model, ids, 8))


def test_wider_beam_never_scores_worse_on_a_real_model():
    model = seqzoo.build("tiny-t5", device="cpu").eval()
    src = torch.randint(0, 256, (2, 6))

    def log_prob(out: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            logits = model(src, out[:, :-1]).log_softmax(-1)
        return logits.gather(-1, out[:, 1:, None]).sum((1, 2))

    narrow = log_prob(seqzoo.generate(model, src, 5, beam_size=1))
    wide = log_prob(seqzoo.generate(model, src, 5, beam_size=4))
    assert torch.all(wide >= narrow - 1e-5)


def test_beam_size_zero_is_a_clear_error():
    model = seqzoo.build("tiny-gpt", device="cpu")
    with pytest.raises(seqzoo.InputError, match="beam_size must be >= 1"):
        seqzoo.generate(model, torch.zeros(1, 2, dtype=torch.long), 2, beam_size=0)
