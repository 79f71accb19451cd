"""torch's AdamW as the built-in optimizers make it: fused where every tensor allows."""
from __future__ import annotations

import torch


def adamw(groups: list[dict], *, lr: float, betas: tuple[float, float], eps: float) -> torch.optim.AdamW:
    """``torch.optim.AdamW`` over ``groups``. The fused kernel (CPU and CUDA) is one pass over each
    parameter instead of foreach's several; it needs floating-point tensors on those devices."""
    fused = all(p.dtype.is_floating_point and p.device.type in ("cpu", "cuda") for g in groups for p in g["params"])
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=fused or None,
                             foreach=None if fused else True)
