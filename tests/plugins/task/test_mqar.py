"""Task `mqar`: the rows' layout against a hand-checked example, the curriculum, held-out groups,
the accuracy metric against known predictions, and the checks against the model's vocabulary."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import seqzoo
from seqzoo.config import TrainConfig
from seqzoo.errors import ConfigError
from seqzoo.interfaces import IGNORE
from seqzoo.plugins.task.mqar import allowed_pairs, mqar_rows, query_slot_weights
from seqzoo.train.objectives import examples_for

BYTES = seqzoo.registry().create("tokenizer", "bytes")


def make(**params):
    task = seqzoo.registry().create("task", {"kind": "mqar", **params})
    task.bind(BYTES, 259, seed=0)
    return task


def test_rows_list_pairs_then_ask_every_key_once_in_a_filler_slot_with_its_value_only_as_the_label():
    ids, labels = mqar_rows(5, 6, 10, 3, torch.Generator().manual_seed(3), seq_len=40)
    assert ids.shape == labels.shape == (5, 40)
    for row, label in zip(ids.tolist(), labels.tolist()):
        keys, values = row[0:12:2], row[1:12:2]
        assert len(set(keys)) == 6 and all(3 <= k < 13 for k in keys)
        assert len(set(values)) == 6 and all(13 <= v < 23 for v in values)  # distinct, upper half
        pairs = dict(zip(keys, values))
        queries = [i for i in range(12, 40) if row[i] != 0]
        assert all(i % 2 == 0 for i in queries)  # queries sit at even offsets after the context
        assert sorted(row[i] for i in queries) == sorted(keys)  # every key asked once
        assert all(row[i] == 0 for i in range(12, 40) if i not in queries)  # filler elsewhere
        assert not set(row[12:]) & set(values)  # the answers are never part of the input
        # a label at each query (its key's value), none anywhere else
        assert {i: t for i, t in enumerate(label) if t != IGNORE} == {i: pairs[row[i]] for i in queries}


def test_a_hand_checked_row():
    """N = 2, keys 3..4, values 5..6, T = 8: the context, then both keys in the two slots (4 and 6)."""
    ids, labels = mqar_rows(1, 2, 2, 3, torch.Generator().manual_seed(0))
    k1, v1, k2, v2, q1, f1, q2, f2 = ids[0].tolist()
    assert {k1, k2} == {3, 4} and {v1, v2} == {5, 6} and {q1, q2} == {3, 4} and f1 == f2 == 0
    a1, a2 = (v1 if q1 == k1 else v2), (v1 if q2 == k1 else v2)
    assert labels[0].tolist() == [IGNORE] * 4 + [a1, IGNORE, a2, IGNORE]


def test_query_slots_follow_the_power_law_most_queries_close_to_the_context():
    weights = query_slot_weights(4, 0.5)
    assert torch.allclose(weights, torch.tensor([1.0, 2 ** -0.5, 3 ** -0.5, 0.5], dtype=torch.float64))
    # one query among 60 slots at a = 0.01: slot s has chance ~ 1/(s+1) / H_60, so slot 0 about 21%
    ids, _ = mqar_rows(4000, 1, 8, 3, torch.Generator().manual_seed(1), seq_len=122)
    slot = ((ids[:, 2:] != 0).float().argmax(1)) // 2
    weights = query_slot_weights(60, 0.01)
    expected = (weights / weights.sum()).float()
    observed = torch.bincount(slot, minlength=60).float() / 4000
    assert abs(observed[0] - expected[0]) < 0.02 and abs(observed[:10].sum() - expected[:10].sum()) < 0.03
    assert observed[30:].sum() < 0.25


def test_the_curriculum_adds_one_n_per_stage_then_draws_from_all():
    pairs = [4, 8, 16, 32]
    # a curriculum of 800 rows: four stages of 200 rows, then every N
    stages = [allowed_pairs(pairs, row, 800) for row in (0, 199, 200, 400, 599, 600, 5000)]
    assert stages == [[4], [4], [4, 8], [4, 8, 16], [4, 8, 16], pairs, pairs]
    assert allowed_pairs(pairs, 0, 0) == pairs
    task = make(pairs=[2, 4], keys=8, curriculum=100)
    contexts = {int((task.batch(start, 3)["labels"] != IGNORE).sum(1).max()) for start in range(0, 50, 5)}
    assert contexts == {2}  # N = 2 only, at first
    assert task.batch(7, 3)["ids"].equal(make(pairs=[2, 4], keys=8, curriculum=100).batch(7, 3)["ids"])


def test_held_out_rows_come_in_one_group_per_n_and_are_the_same_every_time():
    task = make(pairs=[2, 4], keys=8)
    groups = list(task.held_out(5, 4))
    assert [(name, batch["ids"].shape) for name, batch in groups] == [
        ("N=2", (4, 16)), ("N=2", (1, 16)), ("N=4", (4, 16)), ("N=4", (1, 16))]  # one T for every N
    again = list(task.held_out(5, 4))
    assert all(a[1]["ids"].equal(b[1]["ids"]) for a, b in zip(groups, again))


def test_length_per_pair_gives_each_n_its_own_row_length_in_training_and_held_out():
    task = make(pairs=[2, 4, 8], keys=16, length_per_pair=4)
    assert task.seq_len == 32  # the longest row: 4 × the largest N
    lengths = {}
    for start in range(0, 400, 8):
        batch = task.batch(start, 8)
        n = int((batch["labels"] != IGNORE).sum(1)[0])  # one query per pair
        lengths.setdefault(n, set()).add(batch["ids"].shape[1])
    assert lengths == {2: {8}, 4: {16}, 8: {32}}
    assert [(name, batch["ids"].shape[1]) for name, batch in task.held_out(3, 4)] == [
        ("N=2", 8), ("N=4", 16), ("N=8", 32)]
    with pytest.raises(ConfigError, match=r"length_per_pair=3 cannot hold N pairs and their queries"):
        make(pairs=[2], keys=8, length_per_pair=3)
    with pytest.raises(ConfigError, match=r"seq_len=64 and length_per_pair=4 disagree"):
        make(pairs=[2, 4], keys=8, length_per_pair=4, seq_len=64)


class Oracle(nn.Module):
    """A 'model' that answers every query right (or, with ``wrong``, one id off) and is unsure
    elsewhere: its accuracy is known exactly."""

    def __init__(self, wrong: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1))
        self.wrong = wrong
        self.recipe = {"model": {"vocab_size": 259}}

    def forward(self, ids, targets=None, **kwargs):
        logits = torch.zeros(*ids.shape, 259)
        for row in range(ids.shape[0]):
            tokens = ids[row].tolist()
            n = tokens.index(0) // 2  # the first filler follows the context (or the query in slot 0)
            pairs = {tokens[2 * i]: tokens[2 * i + 1] for i in range(n)}
            for i in range(2 * n, len(tokens)):
                if tokens[i] in pairs:
                    logits[row, i, pairs[tokens[i]] + int(self.wrong)] = 10.0
        return logits


@pytest.mark.parametrize("wrong, expected", [(False, 1.0), (True, 0.0)])
def test_accuracy_counts_the_recalled_values_against_known_predictions(wrong, expected):
    from seqzoo.interfaces import LanguageModel

    class Model(Oracle, LanguageModel):
        pass

    model = Model(wrong)
    task = seqzoo.registry().create("task", {"kind": "mqar", "pairs": [2, 4], "keys": 8})
    examples = examples_for(model, BYTES, task)
    result = examples.evaluate(model, TrainConfig(eval_examples=6, batch_size=4), torch.device("cpu"))
    assert result["accuracy"] == expected
    assert result["groups"]["N=2"]["accuracy"] == result["groups"]["N=4"]["accuracy"] == expected


def test_bad_settings_are_refused():
    with pytest.raises(ConfigError, match=r"pairs up to 16 need at least as many keys; keys=8"):
        seqzoo.registry().create("task", {"kind": "mqar", "pairs": [4, 16], "keys": 8})
    task = seqzoo.registry().create("task", {"kind": "mqar", "keys": 200})
    with pytest.raises(ConfigError, match=r"ids 3\.\.402, beyond the model's vocab_size=259"):
        task.bind(BYTES, 259, seed=0)
    with pytest.raises(ConfigError, match=r"seq_len=12 cannot hold N=4 pairs and their queries"):
        seqzoo.registry().create("task", {"kind": "mqar", "pairs": [2, 4], "keys": 8, "seq_len": 12})
    with pytest.raises(ConfigError, match=r"filler=5 is one of the key/value ids 3\.\.18"):
        seqzoo.registry().create("task", {"kind": "mqar", "pairs": [2], "keys": 8, "filler": 5})
