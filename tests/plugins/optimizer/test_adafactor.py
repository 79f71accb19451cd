"""The ``adafactor`` optimizer: torch's Adafactor over the two weight-decay groups, bit for bit,
with its factored second moment (row and column means) for the matrix; FSDP2 is refused."""
from __future__ import annotations

import torch

import seqzoo
from seqzoo.interfaces import TrainedParameters

LR, DECAY = 1e-2, 0.1


def test_steps_equal_torchs_adafactor_bit_for_bit(two_parameters, steps):
    matrix, vector, loss = two_parameters(3)
    ours = seqzoo.registry().create("optimizer", {"kind": "adafactor", "beta2_decay": -0.7}).build(
        TrainedParameters((matrix,), (vector,)), lr=LR, weight_decay=DECAY, betas=(0.9, 0.95))
    steps(ours, loss, 4)
    twin, twin_vector, twin_loss = two_parameters(3)
    theirs = torch.optim.Adafactor([{"params": [twin], "weight_decay": DECAY},
                                    {"params": [twin_vector], "weight_decay": 0.0}], lr=LR, beta2_decay=-0.7)
    steps(theirs, twin_loss, 4)
    assert torch.equal(matrix, twin) and torch.equal(vector, twin_vector)
    state = ours.state[matrix]
    assert state["row_var"].shape == (3, 1) and state["col_var"].shape == (1, 2)  # R + C numbers, not R·C


def test_it_is_refused_under_fsdp2():
    assert not seqzoo.registry().get("optimizer", "adafactor").cls.shards
