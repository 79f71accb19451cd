"""Weight initialisation shared by the architectures (GPT-2 / HF ``_init_weights`` style)."""
from __future__ import annotations

import math

from torch import nn

from ..interfaces import Part


def init_weights(model: nn.Module, std: float, layers: int, residual_names: tuple[str, ...] = ()) -> None:
    """Linear and Embedding weights ~ N(0, std), biases 0. Projections whose last name part is one of
    ``residual_names`` (the ones writing into the residual stream) get std / √(2·layers) (GPT-2), so
    the residual stream's variance does not grow with depth. A component that declares
    ``own_init`` (``seqzoo.interfaces.Part``: an initialisation of its own) is left as its
    constructor made it."""
    skip: set[str] = set()
    for name, module in model.named_modules():
        if any(name.startswith(prefix) for prefix in skip):
            continue
        if isinstance(module, Part) and module.own_init:
            skip.add(name + "." if name else "")  # "" (the root itself) skips everything
            continue
        if isinstance(module, nn.Linear):
            residual = name.rsplit(".", 1)[-1] in residual_names
            scale = 1 / math.sqrt(2 * layers) if residual else 1.0
            nn.init.normal_(module.weight, 0.0, std * scale)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, 0.0, std)
