"""The conformance kit: the contract every component of a kind must honour, as named checks, one
module per kind (``seqzoo.testing.score``, ``.position``, ...), and ``seqzoo.testing.parity``, the
helpers that check a converted Hugging Face model against transformers.

    from seqzoo.testing import check_component
    for result in check_component("score", "additive", hidden=16):
        print(result)

The project's own contract tests (``tests/contract``) and third-party plugin packages run the same
checks. A component may set ``example_params`` (a dict) to the recipe parameters the kit should
use when none are given (e.g. a required ``factor``).

Tests of a new recurrent mixer and its recipes call the kit's pieces directly: its kernels and
layers (``seqzoo.testing.mixer``) ``matches_reference`` (against its plain recurrence in
``seqzoo.reference``), ``relative_difference``, ``gradients_match_reference``,
``segments_equivalence``, ``bfloat16_equivalence`` and ``kernel_paths_agree``; a whole model's
decoding ``kv_cache_equivalence``, ``left_padding_equivalence``, ``beam_search_equivalence`` and
``static_cache_equivalence`` (over ``greedy_logits``).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..registry import own_doc, registry
from . import cell, mixer, optimizer, position, positionwise, rope_scaling, router, schedule, score
from ._shared import (
    Skip,
    beam_search_equivalence,
    greedy_logits,
    kv_cache_equivalence,
    left_padding_equivalence,
    static_cache_equivalence,
)
from .mixer import (
    bfloat16_equivalence,
    gradients_match_reference,
    kernel_paths_agree,
    matches_reference,
    relative_difference,
    segments_equivalence,
)

__all__ = ["CHECKED_KINDS", "CheckResult", "Skip", "beam_search_equivalence", "bfloat16_equivalence",
           "check_component", "checks_for", "component_cases", "component_warnings", "example_params",
           "gradients_match_reference", "greedy_logits", "kernel_paths_agree", "kv_cache_equivalence",
           "left_padding_equivalence", "matches_reference", "parametrize_components", "relative_difference",
           "run_check", "segments_equivalence", "static_cache_equivalence"]

#: kind -> the function that gives a component's named checks, ``(name, params) -> {check: fn}``.
KIT: dict[str, Callable[[str, dict], dict[str, Callable[[], None]]]] = {
    "score": score.checks,
    "position": position.checks,
    "rope_scaling": rope_scaling.checks,
    "norm": lambda name, params: positionwise.checks("norm", name, params),
    "ffn": lambda name, params: positionwise.checks("ffn", name, params),
    "activation": lambda name, params: positionwise.checks("activation", name, params),
    "cell": cell.checks,
    "mixer": mixer.checks,
    "router": router.checks,
    "optimizer": optimizer.checks,
    "schedule": schedule.checks,
}
CHECKED_KINDS = tuple(KIT)


@dataclass(frozen=True)
class CheckResult:
    """One named check of one component: passed, failed (with why) or skipped (with why); or a
    warning (``component_warnings``), which says what to improve but does not fail."""

    kind: str
    name: str
    check: str
    status: str  # "passed" | "failed" | "skipped" | "warned"
    detail: str = ""

    @property
    def passed(self) -> bool:
        return self.status != "failed"

    def __str__(self) -> str:
        detail = f": {self.detail}" if self.detail else ""
        return f"{self.status.upper():7} {self.kind}/{self.name} {self.check}{detail}"


def example_params(kind: str, name: str) -> dict:
    """The recipe parameters the kit builds ``kind/name`` with when none are given."""
    return dict(registry().get(kind, name).cls.example_params)


def checks_for(kind: str, name: str, params: dict | None = None) -> dict[str, Callable[[], None]]:
    """The named checks of one component (built with ``params`` or its ``example_params``)."""
    if kind not in KIT:
        return {}
    return KIT[kind](name, example_params(kind, name) if params is None else params)


def check_component(kind: str, name: str, **params: object) -> list[CheckResult]:
    """Run every contract check for ``kind/name`` and report each by name."""
    component = registry().get(kind, name)
    results = []
    for check, fn in checks_for(kind, component.name, params or None).items():
        torch.manual_seed(0)
        try:
            fn()
        except Skip as why:
            results.append(CheckResult(kind, component.name, check, "skipped", str(why)))
        except Exception as error:  # a contract failure of any sort is reported, not raised
            text = str(error).strip().splitlines()
            detail = f"{type(error).__name__}: {text[0] if text else ''}"
            results.append(CheckResult(kind, component.name, check, "failed", detail))
        else:
            results.append(CheckResult(kind, component.name, check, "passed"))
    return results


def component_warnings(kind: str, name: str) -> list[CheckResult]:
    """What ``kind/name`` should improve without breaking its contract, as "warned" results.

    Kept out of ``check_component``, whose results are the contract itself (suites compare them
    check by check); ``seqzoo check`` prints both. Today: a class without a docstring of its own,
    which leaves ``seqzoo list`` without a summary (an inherited docstring describes the
    interface, not the component, so it does not count).
    """
    component = registry().get(kind, name)
    if own_doc(component.cls):
        return []
    unlisted = "" if component.summary else "; `seqzoo list` shows no summary for it"
    return [CheckResult(kind, component.name, "docstring", "warned",
                        f"{component.cls.__name__} has no docstring of its own{unlisted}; add one "
                        f"saying what it computes, its parameters and the paper")]


def component_cases(kind: str) -> list[tuple[str, str]]:
    """(name, check) pairs for every registered component of ``kind``."""
    return [(c.name, check) for c in registry().list(kind) for check in checks_for(kind, c.name)]


def parametrize_components(kind: str):
    """``@parametrize_components("score")`` on ``def test_x(name, check)`` runs every check of every
    registered score as its own test case; the test body can call ``run_check(kind, name, check)``."""
    import pytest

    cases = component_cases(kind)
    return pytest.mark.parametrize("name, check", cases, ids=[f"{n}-{c}" for n, c in cases])


def run_check(kind: str, name: str, check: str) -> None:
    """Run one named check; raise AssertionError with the reason if it fails."""
    torch.manual_seed(0)
    try:
        checks_for(kind, name)[check]()
    except Skip:
        import pytest

        pytest.skip(f"{kind}/{name} {check} does not apply")


