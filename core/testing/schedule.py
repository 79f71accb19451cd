"""Checks of kind ``schedule``: over runs of several lengths, warm-ups and floors the factor is
finite, within [0, 1], reaches 1 (each group's peak) and nothing above it, rises through the
warm-up, and is a pure function of its arguments (a resumed run continues on the same curve)."""
from __future__ import annotations

import math
from collections.abc import Callable

from ..registry import registry
from ._shared import spec

#: (steps, warmup, floor): short and long runs, no warm-up, a warm-up longer than a tenth, a floor of 0.
RUNS = ((10, 0, 0.1), (100, 10, 0.1), (1000, 100, 0.0), (57, 5, 0.3))


def checks(name: str, params: dict) -> dict[str, Callable[[], None]]:
    make = lambda: registry().create("schedule", spec(name, params))  # noqa: E731

    def curve(steps: int, warmup: int, floor: float) -> list[float]:
        schedule = make()
        return [schedule.factor(step, steps, warmup, floor) for step in range(steps)]

    def bounded_with_peak_one() -> None:
        for steps, warmup, floor in RUNS:
            values = curve(steps, warmup, floor)
            bad = [(s, v) for s, v in enumerate(values) if not (math.isfinite(v) and 0 <= v <= 1 + 1e-12)]
            if bad:
                raise AssertionError(f"steps={steps} warmup={warmup} floor={floor}: factor {bad[0][1]!r} at step "
                                     f"{bad[0][0]} is outside [0, 1]")
            if abs(max(values) - 1) > 1e-12:
                raise AssertionError(f"steps={steps} warmup={warmup}: the factor peaks at {max(values)!r}, not 1 "
                                     f"(train.lr is the peak rate)")

    def warms_up() -> None:
        for steps, warmup, floor in RUNS:
            values = curve(steps, warmup, floor)[:warmup]
            if any(b <= a for a, b in zip(values, values[1:])):
                raise AssertionError(f"steps={steps} warmup={warmup}: the factor does not rise through the warm-up")

    def pure() -> None:
        for steps, warmup, floor in RUNS:
            if curve(steps, warmup, floor) != curve(steps, warmup, floor):
                raise AssertionError("two instances give different factors for the same arguments; a resumed run "
                                     "would leave the curve it was on")

    return {"bounded_with_peak_one": bounded_with_peak_one, "warms_up": warms_up, "pure": pure}
