"""ReLU (Nair & Hinton, 2010): relu(x) = max(0, x), elementwise. Vaswani 2017's and OPT's FFN."""
from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

import seqzoo


class Relu(nn.Module):
    """No recipe params."""

    def forward(self, x: Tensor) -> Tensor:
        """x (...) -> (...)."""
        return F.relu(x)


@seqzoo.hookimpl
def seqzoo_components():
    return [seqzoo.Component("activation", "relu", Relu, summary="max(0, x) (Vaswani 2017, OPT)")]
