"""Weight initialisation shared by the architectures (GPT-2 / HF ``_init_weights`` / mamba_ssm
``_init_weights`` style), decided per tensor from what each component declares (``Part``)."""
from __future__ import annotations

import math

from torch import nn

from ..interfaces import Part


def init_weights(model: nn.Module, std: float, branches: int) -> None:
    """``nn.Linear`` and ``nn.Embedding`` weights ~ N(0, std), biases 0 — but:

    - a component's ``residual_projections`` (the linears writing into the residual stream) get
      std / √branches, where ``branches`` counts the residual branches of the whole model (2 per
      GPT-2 layer: attention and MLP; 1 per Mamba layer, which is a mixer alone), so the stream's
      variance does not grow with depth;
    - a component's ``keep_init`` tensors keep their constructor's values (Mamba's Δ projection);
    - a component with ``own_init`` is left whole as its constructor made it (torch's cells).
    """
    skipped: list[str] = []
    kept: set[str] = set()
    residual: set[str] = set()
    for name, module in model.named_modules():
        if not isinstance(module, Part):
            continue
        prefix = f"{name}." if name else ""
        if module.own_init:
            skipped.append(prefix)  # "" (the root itself) skips everything
        kept.update(prefix + tensor for tensor in module.keep_init)
        residual.update(prefix + linear for linear in module.residual_projections)
    scale = 1 / math.sqrt(branches)
    done: set[int] = set()  # a tied weight (the LM head's, the embedding's) is initialised once
    for name, module in model.named_modules():
        if any(f"{name}.".startswith(prefix) for prefix in skipped):
            continue
        if not isinstance(module, (nn.Linear, nn.Embedding)):
            continue
        if f"{name}.weight" not in kept and id(module.weight) not in done:
            nn.init.normal_(module.weight, 0.0, std * (scale if name in residual else 1.0))
            done.add(id(module.weight))
        if isinstance(module, nn.Linear) and module.bias is not None and f"{name}.bias" not in kept:
            nn.init.zeros_(module.bias)
