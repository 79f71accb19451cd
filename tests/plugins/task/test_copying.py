"""Task `copying`: the rows against a hand-checked example, the training lengths, the held-out
groups, and the exact-copy score against known predictions."""
from __future__ import annotations

import pytest
import torch

import seqzoo
from seqzoo.config import TrainConfig
from seqzoo.errors import ConfigError
from seqzoo.interfaces import IGNORE, LanguageModel
from seqzoo.plugins.task.copying import COPY, PAD, START, copying_rows
from seqzoo.train.objectives import examples_for

BYTES = seqzoo.registry().create("tokenizer", "bytes")


def make(**params):
    task = seqzoo.registry().create("task", {"kind": "copying", **params})
    task.bind(BYTES, 259, seed=0)
    return task


def test_a_hand_checked_row():
    """'x y' over symbols 3..6, padded to T = 8: ⟨s⟩ x y ⟨copy⟩ x y 0 0, labels x y at ⟨copy⟩ and x."""
    ids, labels = copying_rows([2], 4, 3, torch.Generator().manual_seed(1), seq_len=8)
    x, y = ids[0, 1:3].tolist()
    assert ids[0].tolist() == [START, x, y, COPY, x, y, PAD, PAD]
    assert labels[0].tolist() == [IGNORE, IGNORE, IGNORE, x, y, IGNORE, IGNORE, IGNORE]
    assert 3 <= x <= 6 and 3 <= y <= 6


def test_rows_of_mixed_lengths_hold_each_string_twice_and_label_only_the_copy():
    lengths = [1, 5, 3, 7]
    ids, labels = copying_rows(lengths, 26, 3, torch.Generator().manual_seed(0))
    assert ids.shape == labels.shape == (4, 16)
    for row, label, n in zip(ids.tolist(), labels.tolist(), lengths):
        string = row[1:n + 1]
        assert row[0] == START and row[n + 1] == COPY and all(3 <= s < 29 for s in string)
        assert row[n + 2:2 * n + 2] == string and set(row[2 * n + 2:]) <= {PAD}
        assert label == [IGNORE] * (n + 1) + string + [IGNORE] * (16 - 2 * n - 1)


def test_training_rows_draw_lengths_in_range_and_held_out_rows_come_per_length():
    task = make(min_len=2, max_len=6, eval_lengths=[4, 12])
    batch = task.batch(0, 256)
    counts = (batch["labels"] != IGNORE).sum(1)
    assert batch["ids"].shape == (256, 14) and set(counts.tolist()) == {2, 3, 4, 5, 6}
    assert task.batch(5, 3)["ids"].equal(make(min_len=2, max_len=6, eval_lengths=[4, 12]).batch(5, 3)["ids"])
    groups = list(task.held_out(5, 4))
    assert [(name, tuple(b["ids"].shape)) for name, b in groups] == [
        ("L=4", (4, 10)), ("L=4", (1, 10)), ("L=12", (4, 26)), ("L=12", (1, 26))]
    assert all(a[1]["ids"].equal(b[1]["ids"]) for a, b in zip(groups, task.held_out(5, 4)))


class Copier(LanguageModel):
    """Predicts every copied symbol right, except the last symbol of every other row (``slip``):
    its token accuracy and exact-copy share are known exactly."""

    def __init__(self, slip: bool) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.slip = slip
        self.recipe = {"model": {"vocab_size": 259}}

    def forward(self, ids, targets=None, **kwargs):
        logits = torch.zeros(*ids.shape, 259)
        for row in range(ids.shape[0]):
            tokens = ids[row].tolist()
            n = tokens.index(COPY) - 1
            for i in range(n):
                answer = tokens[1 + i] + int(self.slip and row % 2 == 0 and i == n - 1)
                logits[row, n + 1 + i, answer] = 10.0
        return logits


@pytest.mark.parametrize("slip, exact, token", [(False, 1.0, 1.0), (True, 0.5, 1 - 0.5 / 4)])
def test_exact_copies_and_token_accuracy_against_known_predictions(slip, exact, token):
    task = seqzoo.registry().create("task", {"kind": "copying", "max_len": 4, "eval_lengths": [4]})
    result = examples_for(Copier(slip), BYTES, task).evaluate(Copier(slip), TrainConfig(eval_examples=8, batch_size=4),
                                                              torch.device("cpu"))
    assert result["exact"] == exact and result["accuracy"] == pytest.approx(token)


def test_bad_settings_are_refused():
    with pytest.raises(ConfigError, match=r"min_len=9 is larger than max_len=4"):
        make(min_len=9, max_len=4)
    with pytest.raises(ConfigError, match=r"first=2 would give symbols the ids 0\.\.2"):
        make(first=2)
    task = seqzoo.registry().create("task", {"kind": "copying", "alphabet": 300})
    with pytest.raises(ConfigError, match=r"ids 3\.\.302, beyond the model's vocab_size=259"):
        task.bind(BYTES, 259, seed=0)
