"""Squared ReLU (So et al., 2021, "Primer"): relu2(x) = max(0, x)², elementwise.

The ungated FFN activation of Nemotron-H (its MLPs and experts; Hugging Face's ``relu2``).
"""
from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from seqzoo.interfaces import Activation
from seqzoo.registry import builtin


@builtin("max(0, x)² (Primer; Nemotron-H's MLP)")
class Relu2(Activation):
    """No recipe params."""

    def forward(self, x: Tensor) -> Tensor:
        """x (...) -> (...)."""
        return F.relu(x).square()
