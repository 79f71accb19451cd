"""Checks of the position-wise kinds (``norm``, ``ffn``, ``activation``): modules from (..., C) to
(..., C) that treat every position on its own."""
from __future__ import annotations

from collections.abc import Callable

import torch

from ..registry import registry
from ._shared import (
    B,
    C,
    T,
    check_dtypes,
    gradcheck,
    spec,
    state_dict_round_trip,
)


def checks(kind: str, name: str, params: dict) -> dict[str, Callable[[], None]]:
    """norm, ffn and activation: (..., C) -> (..., C) modules."""
    if kind == "activation":
        make = lambda: registry().create("activation", spec(name, params))  # noqa: E731
    else:
        make = lambda: registry().create(kind, spec(name, params), C)  # noqa: E731
    x = torch.randn(B, T, C)

    def shapes() -> None:
        if make()(x).shape != x.shape:
            raise AssertionError(f"output shape differs from the input's {tuple(x.shape)}")

    def dtypes() -> None:
        check_dtypes(make, lambda m, dt: m(x.to(dt)))

    def gradients() -> None:
        module = make().double()
        gradcheck(module, x[:1, :2])

    def state_dict() -> None:
        state_dict_round_trip(make, lambda m: m(x))

    def positions_stay_apart() -> None:
        """What a norm, an FFN and an activation promise: each position's output depends on that
        position alone. A norm that averaged over time (leaking later tokens into earlier ones)
        passes every other check; this one changes every other position and compares."""
        module = make().eval()
        changed = x.flip(1) * 2 + 1  # every other position different (whatever the seed), position 2 kept
        changed[:, 2] = x[:, 2]
        with torch.no_grad():
            here, there = module(x)[:, 2], module(changed)[:, 2]
        worst = (here - there).abs().max().item()
        if worst > 1e-6:
            raise AssertionError(f"changing the other positions changed position 2's output by {worst:.2e}; "
                                 f"a {kind} must treat every position on its own")

    return {"shapes": shapes, "dtypes": dtypes, "gradients": gradients, "state_dict": state_dict,
            "positions_stay_apart": positions_stay_apart}
