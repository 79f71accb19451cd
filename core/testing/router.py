"""Checks of kind ``router``: distinct experts in range, float32 weights, differentiable, state_dict."""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..registry import registry
from ._shared import (
    B,
    C,
    Skip,
    T,
    gradcheck,
    spec,
    state_dict_round_trip,
)


def checks(name: str, params: dict) -> dict[str, Callable[[], None]]:
    """Routers: k distinct experts per token in range, finite non-negative float32 weights, rows of
    ``probs`` that sum to 1, weights differentiable in x and the router's parameters."""
    experts, top_k = 6, 2
    make = lambda: registry().create("router", spec(name, params), C, experts, top_k)  # noqa: E731
    x = torch.randn(B * T, C)

    def shapes() -> None:
        routing = make()(x)
        chosen = routing.experts
        if chosen.shape != (B * T, top_k) or routing.weights.shape != (B * T, top_k):
            raise AssertionError(f"experts {tuple(chosen.shape)} / weights {tuple(routing.weights.shape)}, "
                                 f"expected {(B * T, top_k)}")
        if chosen.dtype != torch.int64 or chosen.min() < 0 or chosen.max() >= experts:
            raise AssertionError("experts must be int64 indices in [0, E)")
        if (chosen.sort(-1).values.diff(dim=-1) == 0).any():
            raise AssertionError("a token chose the same expert twice")
        if routing.logits.shape != (B * T, experts) or routing.probs.shape != (B * T, experts):
            raise AssertionError("logits and probs must be (N, E)")
        if not torch.allclose(routing.probs.sum(-1), torch.ones(B * T)):
            raise AssertionError("probs rows must sum to 1")
        if not torch.isfinite(routing.weights).all() or (routing.weights < 0).any():
            raise AssertionError("weights must be finite and non-negative")

    def dtypes() -> None:
        for dtype in (torch.bfloat16, torch.float16):
            routing = make().to(dtype)(x.to(dtype))
            if routing.weights.dtype != torch.float32 or routing.logits.dtype != torch.float32:
                raise AssertionError(f"{dtype} input: weights and logits must be float32 (routing in float32)")

    def gradients() -> None:
        router = make().double()
        chosen = router(x.double()).experts
        # with the choice fixed (a small step of gradcheck does not flip a top-k of random logits),
        # the weights are a smooth function of x and of every parameter
        def weights(inputs: Tensor) -> Tensor:
            routing = router(inputs)
            if not torch.equal(routing.experts, chosen):
                raise Skip("the choice flipped under gradcheck's step")
            return routing.weights
        gradcheck(weights, x)
        router(x.double()).weights.sum().backward()
        if any(p.grad is None for p in router.parameters()):
            raise AssertionError("a router parameter gets no gradient through the weights")

    def state_dict() -> None:
        state_dict_round_trip(make, lambda m: m(x).weights)

    return {"shapes": shapes, "dtypes": dtypes, "gradients": gradients, "state_dict": state_dict}
