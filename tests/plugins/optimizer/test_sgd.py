"""The ``sgd`` optimizer: two steps of momentum (and of Nesterov's momentum) against the update
written out on a 2-parameter problem, L2 decay on the matrix only; the refusal of Nesterov without
momentum."""
from __future__ import annotations

import pytest
import torch

import seqzoo
from seqzoo.errors import ConfigError, RegistryError
from seqzoo.interfaces import TrainedParameters

LR, DECAY, MU = 0.05, 0.1, 0.9


@pytest.mark.parametrize("nesterov", [False, True])
def test_two_steps_are_momentum_written_out(nesterov, two_parameters):
    matrix, vector, loss = two_parameters(2)
    optimizer = seqzoo.registry().create("optimizer", {"kind": "sgd", "momentum": MU, "nesterov": nesterov}).build(
        TrainedParameters((matrix,), (vector,)), lr=LR, weight_decay=DECAY, betas=(0.9, 0.95))
    want = [matrix.detach().clone(), vector.detach().clone()]
    buffers = [None, None]
    for _ in range(2):
        optimizer.zero_grad()
        loss().backward()
        for i, (p, decay) in enumerate(zip((matrix, vector), (DECAY, 0.0))):
            # The gradient at the parameters before this step, plus the L2 term (coupled decay).
            g = p.grad + decay * want[i]
            buffers[i] = g if buffers[i] is None else MU * buffers[i] + g
            want[i] = want[i] - LR * (g + MU * buffers[i] if nesterov else buffers[i])
        optimizer.step()
    torch.testing.assert_close(matrix.detach(), want[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(vector.detach(), want[1], rtol=0, atol=1e-6)


def test_nesterov_without_momentum_is_refused():
    with pytest.raises(ConfigError, match=r"optimizer sgd: nesterov=true needs momentum > 0 and dampening 0, got "
                                        r"momentum=0.0"):
        seqzoo.registry().create("optimizer", {"kind": "sgd", "momentum": 0, "nesterov": True})


def test_an_unknown_option_names_the_closest():
    with pytest.raises(RegistryError, match="unknown key 'momentun'; did you mean 'momentum'"):
        seqzoo.registry().create("optimizer", {"kind": "sgd", "momentun": 0.5})
