"""Logistic sigmoid: σ(x) = 1 / (1 + e^(−x)), elementwise. The gate of the original GLU
(Dauphin et al., 2017; Shazeer, 2020's FFN_GLU)."""
from __future__ import annotations

import torch
from torch import Tensor, nn

import seqzoo


class Sigmoid(nn.Module):
    """No recipe params."""

    def forward(self, x: Tensor) -> Tensor:
        """x (...) -> (...)."""
        return torch.sigmoid(x)


@seqzoo.hookimpl
def seqzoo_components():
    return [seqzoo.Component("activation", "sigmoid", Sigmoid,
                             summary="1 / (1 + e^(-x)) (the original GLU gate)")]
