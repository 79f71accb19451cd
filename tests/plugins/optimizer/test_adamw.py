"""The ``adamw`` optimizer: torch's AdamW over the two weight-decay groups, bit for bit, and its
first step against Adam's formula written out on a 2-parameter problem (one matrix, one vector)."""
from __future__ import annotations

import torch

import seqzoo
from seqzoo.interfaces import TrainedParameters

LR, DECAY, BETAS = 1e-2, 0.1, (0.9, 0.95)


def test_first_step_is_adams_formula_with_decoupled_decay_on_the_matrix_only(two_parameters):
    matrix, vector, loss = two_parameters(1)
    m0, v0 = matrix.detach().clone(), vector.detach().clone()
    loss().backward()
    gm, gv = matrix.grad.clone(), vector.grad.clone()
    optimizer = seqzoo.registry().create("optimizer", {"kind": "adamw", "eps": 1e-9}).build(
        TrainedParameters((matrix,), (vector,)), lr=LR, weight_decay=DECAY, betas=BETAS)
    optimizer.step()
    # Step 1: m̂ = g, v̂ = g², so the update is g / (|g| + ε); decay multiplies the matrix by 1 − lr·λ.
    torch.testing.assert_close(matrix.detach(), m0 * (1 - LR * DECAY) - LR * gm / (gm.abs() + 1e-9))
    torch.testing.assert_close(vector.detach(), v0 - LR * gv / (gv.abs() + 1e-9))


def test_steps_equal_torchs_adamw_bit_for_bit(two_parameters, steps):
    matrix, vector, loss = two_parameters(1)
    ours = seqzoo.registry().create("optimizer", "adamw").build(TrainedParameters((matrix,), (vector,)), lr=LR,
                                                                 weight_decay=DECAY, betas=BETAS)
    steps(ours, loss, 5)
    twin, twin_vector, twin_loss = two_parameters(1)
    theirs = torch.optim.AdamW([{"params": [twin], "weight_decay": DECAY},
                                {"params": [twin_vector], "weight_decay": 0.0}], lr=LR, betas=BETAS, fused=True)
    steps(theirs, twin_loss, 5)
    assert torch.equal(matrix, twin) and torch.equal(vector, twin_vector)
