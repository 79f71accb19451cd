"""The 2-parameter problem the optimizers' updates are written out on: a (3, 2) matrix and a (2,)
vector fitting M·v to a target, the matrix in the decayed group and the vector in the other."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture
def two_parameters():
    """``make(seed) -> (matrix, vector, loss)``, the same numbers for the same seed."""
    def make(seed: int):
        torch.manual_seed(seed)
        matrix, vector = torch.randn(3, 2, requires_grad=True), torch.randn(2, requires_grad=True)
        return matrix, vector, lambda: ((matrix @ vector - torch.tensor([1.0, -2.0, 0.5])) ** 2).sum()
    return make


@pytest.fixture
def steps():
    """``steps(optimizer, loss, n)``: n steps of zero_grad, backward, step."""
    def run(optimizer, loss, n: int) -> None:
        for _ in range(n):
            optimizer.zero_grad()
            loss().backward()
            optimizer.step()
    return run
