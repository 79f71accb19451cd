"""Position-wise parts: norms, feed-forward blocks, activations, and a mixture of experts' router
with the auxiliary losses it reports."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..errors import ConfigError
from .part import Part


class Norm(Part):
    """A normalisation layer. Constructor ``(dim, **params)``; ``forward(x (..., C)) -> (..., C)``."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim


class FeedForward(Part):
    """A position-wise feed-forward block. Constructor ``(dim, **params)``;
    ``forward(x (B, T, C)) -> (B, T, C)``."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def active_parameters(self) -> int:
        """The parameters one token goes through: all of them, unless the block routes each token to
        a few of its parts (a mixture of experts)."""
        return sum(p.numel() for p in self.parameters())


class Activation(Part):
    """An elementwise activation (kind ``activation``): ``forward(x) -> x``'s shape. Constructor
    ``(**params)`` only; FFNs name one in their recipe (``{kind: mlp, activation: silu}``)."""


@dataclass
class Routing:
    """A router's decision for N tokens: ``experts`` (N, k) int64, the chosen experts; ``weights``
    (N, k) float32, what each chosen expert's output is multiplied by; ``logits`` (N, E) float32, the
    raw router logits (the z-loss reads them); ``probs`` (N, E) float32, each token's distribution
    over all experts (the balancing loss averages it)."""

    experts: Tensor
    weights: Tensor
    logits: Tensor
    probs: Tensor


class Router(Part):
    """Chooses ``top_k`` of ``experts`` experts per token. Constructor ``(dim, experts, top_k,
    **params)``; ``forward(x (N, C)) -> Routing``. Scores are computed in float32: a tie or a flip
    in the top-k under bfloat16 would send a token to another expert."""

    def __init__(self, dim: int, experts: int, top_k: int) -> None:
        super().__init__()
        if top_k > experts:
            raise ConfigError(f"router: top_k={top_k} must be at most experts={experts}")
        self.dim, self.experts, self.top_k = dim, experts, top_k


class AuxiliaryLosses:
    """A module that computes training signals beside its output (a mixture of experts' balancing
    and z-losses, its expert load). After each forward, ``auxiliary`` holds ``{name: (coefficient,
    loss tensor)}`` for the losses that join the training objective and ``statistics`` holds
    ``{name: tensor}`` for what is only reported. The trainer adds Σ coefficient·loss over the
    model's modules (``auxiliary_losses``) and logs both."""

    auxiliary: dict[str, tuple[float, Tensor]]
    statistics: dict[str, Tensor]


def auxiliary_losses(model: nn.Module) -> tuple[Tensor | None, dict[str, Tensor]]:
    """(Σ coefficient·loss over every ``AuxiliaryLosses`` module of ``model`` from its last
    forward, or None when there is none; {name: mean value over those modules} to report, as 0-d
    tensors on the device: reading them is the caller's sync, at its log steps)."""
    total, values = None, {}
    for module in model.modules():
        if not isinstance(module, AuxiliaryLosses):
            continue
        for name, (coefficient, loss) in module.auxiliary.items():
            values.setdefault(name, []).append(loss.detach().float())
            if coefficient:
                total = coefficient * loss if total is None else total + coefficient * loss
    return total, {name: torch.stack(v).mean() for name, v in values.items()}


def auxiliary_statistics(model: nn.Module) -> dict[str, list[list[float]]]:
    """{name: one list per ``AuxiliaryLosses`` module that has it} from the last forward: a mixture
    of experts' ``expert_load`` per MoE layer, in layer order."""
    out: dict[str, list[list[float]]] = {}
    for module in model.modules():
        if isinstance(module, AuxiliaryLosses):
            for name, value in module.statistics.items():
                out.setdefault(name, []).append(value.detach().float().flatten().tolist())
    return out
