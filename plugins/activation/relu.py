"""ReLU (Nair & Hinton, 2010): relu(x) = max(0, x), elementwise. Vaswani 2017's and OPT's FFN."""
from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from seqzoo.interfaces import Activation
from seqzoo.registry import builtin


@builtin("max(0, x) (Vaswani 2017, OPT)")
class Relu(Activation):
    """No recipe params."""

    def forward(self, x: Tensor) -> Tensor:
        """x (...) -> (...)."""
        return F.relu(x)
