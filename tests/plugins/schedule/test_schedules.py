"""The built-in schedules against their formulas at the steps where they change phase: the end of
warm-up, the start of WSD's decay, the run's end; and the 2017 Transformer's rates from its paper's
expression d^−0.5 · min(s^−0.5, s · w^−1.5)."""
from __future__ import annotations

import math

import pytest

import seqzoo
from seqzoo.config import TrainConfig
from seqzoo.train.training import lr_factor

STEPS, WARMUP, FLOOR = 110, 10, 0.1


def schedule(spec):
    return seqzoo.registry().create("schedule", spec)


def factors(spec, steps: int = STEPS, warmup: int = WARMUP, floor: float = FLOOR) -> list[float]:
    made = schedule(spec)
    return [made.factor(step, steps, warmup, floor) for step in range(steps + 1)]


def cosine(p: float) -> float:
    return FLOOR + (1 - FLOOR) * 0.5 * (1 + math.cos(math.pi * p))


def linear(p: float) -> float:
    return FLOOR + (1 - FLOOR) * (1 - p)


@pytest.mark.parametrize("name", ["cosine", "linear", "constant", "wsd"])
def test_warm_up_is_linear_to_the_peak(name):
    f = factors(name)
    assert f[:WARMUP] == pytest.approx([(s + 1) / WARMUP for s in range(WARMUP)])
    assert f[WARMUP - 1] == f[WARMUP] == pytest.approx(1.0)


def test_cosine_falls_along_half_a_cosine_to_the_floor():
    f = factors("cosine")
    for step in (10, 35, 60, 109, 110):
        assert f[step] == pytest.approx(cosine((step - WARMUP) / (STEPS - WARMUP)), abs=1e-15), step
    assert f[60] == pytest.approx(0.55) and f[110] == pytest.approx(FLOOR)


def test_linear_falls_in_a_straight_line_to_the_floor():
    f = factors("linear")
    for step in (10, 35, 60, 109, 110):
        assert f[step] == pytest.approx(linear((step - WARMUP) / (STEPS - WARMUP)), abs=1e-15), step


def test_constant_holds_the_peak_and_ignores_the_floor():
    assert factors("constant")[WARMUP:] == [1.0] * (STEPS + 1 - WARMUP)
    assert factors("constant", warmup=0)[0] == 1.0


@pytest.mark.parametrize("shape, curve", [("linear", lambda p: 1 - p),
                                          ("cosine", lambda p: 0.5 * (1 + math.cos(math.pi * p))),
                                          ("sqrt", lambda p: 1 - math.sqrt(p))])
def test_wsd_holds_the_peak_then_decays_over_the_last_fraction(shape, curve):
    steps, decay = 100, 0.2  # the decay starts at step 80
    f = factors({"kind": "wsd", "decay": decay, "shape": shape}, steps=steps)
    assert f[WARMUP:80] == [1.0] * (80 - WARMUP)  # stable: exactly the peak
    for step in (80, 85, 90, 99, 100):
        p = (step - 80) / 20
        assert f[step] == pytest.approx(FLOOR + (1 - FLOOR) * curve(p), abs=1e-15), step
    assert f[100] == pytest.approx(FLOOR)


def test_wsd_that_decays_over_the_whole_run_is_linear_or_cosine():
    assert factors({"kind": "wsd", "decay": 1.0}) == factors("linear")
    assert factors({"kind": "wsd", "decay": 1.0, "shape": "cosine"}) == factors("cosine")
    assert set(factors({"kind": "wsd", "decay": 0.0})[WARMUP:]) == {1.0}  # no decay at all


def test_wsd_decay_never_starts_inside_the_warm_up():
    f = factors({"kind": "wsd", "decay": 0.95}, steps=100, warmup=10)  # 95 steps asked, 90 left after warm-up
    assert f[9] == pytest.approx(1.0) and f[10] == pytest.approx(1.0) and f[55] == pytest.approx(linear(0.5))


def test_inverse_sqrt_is_the_transformers_rate_from_its_paper():
    d, w = 512, 4000
    peak = d ** -0.5 * w ** -0.5  # train.lr for the paper's rates
    made = schedule("inverse_sqrt")
    for s in (1, 2, w - 1, w, w + 1, 4 * w, 100_000):
        paper = d ** -0.5 * min(s ** -0.5, s * w ** -1.5)
        assert peak * made.factor(s - 1, 1000, w, 0.1) == pytest.approx(paper, rel=1e-12), s
    assert made.factor(4 * w - 1, 10, w, 0.5) == pytest.approx(0.5)  # 1/√4; the run's length and floor do not enter
    assert [made.factor(step, 10, 0, 0.1) for step in (0, 3, 99)] == pytest.approx([1.0, 0.5, 0.1])  # no warm-up


def test_lr_factor_reads_the_recipes_schedule():
    config = TrainConfig(steps=100, warmup=10, schedule={"kind": "wsd", "decay": 0.2})
    assert lr_factor(79, config) == 1.0 and lr_factor(90, config) == pytest.approx(0.55)
