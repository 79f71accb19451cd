"""The recall and copying studies' shared design (seqzoo.lab.sweep): the pre-registered verdict
against hand-made tables, one per outcome, and the state sizes the tables report."""
from __future__ import annotations

import pytest

from seqzoo.lab.sweep import (
    Contender,
    Depths,
    compute_line,
    falls,
    first_below,
    line_style,
    overall_verdict,
    state_floats,
    state_space_contenders,
    study,
    tabulate,
    trainability,
    verdict,
)

XS = [4, 8, 16, 32, 64]
WHO = [Contender("attention", "attention", None, ()), *state_space_contenders({"mamba": [4, 16], "mamba2": [16]},
                                                                               hybrid=True)]
SOLVED = [[1.0] * 5, [0.995, 1.0, 1.0, 0.999, 0.99], [1.0] * 5]  # three seeds of attention


def table(**curves):
    means = {"attention": [sum(s[i] for s in SOLVED) / 3 for i in range(5)], "hybrid 1:4": [1.0, 1.0, 0.99, 0.98, 0.97]}
    means.update({name.replace("_", " ").replace("mamba2 ", "mamba2 N=").replace("mamba ", "mamba N="): c
                  for name, c in curves.items()})
    return means


SUPPORTED = table(mamba_4=[0.95, 0.8, 0.5, 0.2, 0.05], mamba_16=[1.0, 0.98, 0.85, 0.5, 0.2],
                  mamba2_16=[1.0, 0.95, 0.8, 0.4, 0.1])


def test_a_table_where_every_criterion_holds_is_supported():
    outcome, reasons = verdict(WHO, SUPPORTED, SOLVED, XS, reference="attention")
    assert outcome == "supported"
    assert "mamba: first x below 0.9 by state N=4: 8, N=16: 16 (grows)" in reasons
    assert any(r.startswith("hybrid 1:4: at most 0.027") for r in reasons)


def test_attention_unsolved_in_one_seed_makes_the_table_invalid():
    seeds = [list(s) for s in SOLVED]
    seeds[2][3] = 0.97
    outcome, reasons = verdict(WHO, SUPPORTED, seeds, XS, reference="attention")
    assert outcome == "invalid" and reasons == [
        "attention reaches 0.970 < 0.99 at 32 in seed #2: raise the budget; no comparison is reported"]
    # the copying study checks only the lengths inside the training range
    assert verdict(WHO, SUPPORTED, seeds, XS, reference="attention", checked=[4, 8])[0] == "supported"


def test_a_small_state_that_keeps_up_with_attention_is_not_supported():
    means = dict(SUPPORTED, **{"mamba N=4": [1.0, 0.99, 0.98, 0.97, 0.96]})
    outcome, reasons = verdict(WHO, means, SOLVED, XS, reference="attention")
    assert outcome == "not supported" and "mamba N=4 (the smallest mamba state)" in reasons[0]


@pytest.mark.parametrize("change", [
    {"mamba N=16": [0.8, 0.7, 0.6, 0.5, 0.4]},              # the larger state drops below 0.9 sooner
    {"mamba N=4": [0.9, 0.9, 0.9, 0.9, 0.85]},              # does not fall far enough, nor 0.2 below at N = 64
    {"hybrid 1:4": [1.0, 0.9, 0.8, 0.7, 0.6]},              # the hybrid does not bring recall back
    {"mamba2 N=16": [0.3, 0.9, 0.2, 0.1, 0.05]},            # rises by more than noise on the way
])
def test_anything_else_is_inconclusive(change):
    assert verdict(WHO, dict(SUPPORTED, **change), SOLVED, XS, reference="attention")[0] == "inconclusive"


def test_helpers_and_the_rule_across_depths():
    assert falls([1.0, 0.97, 0.99, 0.5]) and not falls([1.0, 0.9, 0.97]) and not falls([0.5, 0.6, 0.2 + 0.31])
    assert first_below([1.0, 0.95, 0.7], [4, 8, 16], 0.9) == 16 and first_below([1.0], [4], 0.9) == float("inf")
    mamba, mamba2 = WHO[1], WHO[3]
    assert state_floats(mamba, 64) == 2 * 64 * 4 and state_floats(mamba2, 64) == 2 * 64 * 16
    assert state_floats(WHO[0], 64) is None
    assert overall_verdict(["supported", "supported"]) == "supported"
    assert overall_verdict(["supported", "not supported"]) == "not supported"
    assert overall_verdict(["supported", "inconclusive"]) == "inconclusive"
    assert overall_verdict(["not supported", "invalid"]) == "invalid"


def test_the_mimetic_control_sits_after_its_family_outside_the_verdict_and_reads_against_its_default():
    who = [Contender("attention", "attention", None, ()),
           *state_space_contenders({"mamba": [4, 16], "mamba2": [16]}, hybrid=True, mimetic={"mamba": [16]})]
    assert [c.name for c in who] == ["attention", "mamba N=4", "mamba N=16", "mamba N=16 mimetic", "mamba2 N=16",
                                     "hybrid 1:4"]
    control = who[3]
    assert control.family == "mamba mimetic" and not control.pure_ssm and "mimetic: true" in control.overrides[0]
    assert [line_style(c.family) for c in who] == ["--", "-", "-", ":", "-", "--"]  # the figures' lines
    # a control that learns where the default does not changes nothing in the verdict ...
    learned = dict(SUPPORTED, **{"mamba N=16 mimetic": [1.0, 1.0, 0.95, 0.7, 0.3]})
    outcome, reasons = verdict(who, learned, SOLVED, XS, reference="attention")
    assert outcome == "supported" and not any("mimetic" in r for r in reasons)
    # ... and reads as trainability where it is ≥ 0.2 above a default below 0.9, with its own limit
    assert trainability(who, learned, XS) == ["mamba N=16 mimetic against mamba N=16: trainability at x = 32; "
                                              "the mimetic start first drops at x = 32 below 0.9"]
    same = dict(SUPPORTED, **{"mamba N=16 mimetic": SUPPORTED["mamba N=16"]})
    assert trainability(who, same, XS) == [
        "mamba N=16 mimetic against mamba N=16: no change; the mimetic start first drops at x = 16 below 0.9"]


def test_tabulate_reads_the_control_only_when_the_table_is_valid():
    who = [Contender("attention", "attention", None, ()),
           *state_space_contenders({"mamba": [16]}, hybrid=False, mimetic={"mamba": [16]})]
    groups = [f"N={x}" for x in XS]

    def found(attention):
        curves = {"attention": attention, "mamba N=16": [0.3, 0.2, 0.1, 0.05, 0.02],
                  "mamba N=16 mimetic": [1.0, 1.0, 0.8, 0.4, 0.1]}
        runs = {name: [{"eval": {"groups": {g: {"accuracy": v} for g, v in zip(groups, curve)}}}] * 3
                for name, curve in curves.items()}
        return {"runs": runs, "parameters": dict.fromkeys(curves, 1000), "best": dict.fromkeys(curves, 1e-3),
                "sweep": {name: {1e-3: 0.5} for name in curves}}

    data, rows = tabulate(who, found([1.0] * 5), groups, "accuracy", XS, dim=64, reference="attention")
    assert data["reasons"][-1] == ("mamba N=16 mimetic against mamba N=16: trainability at x = 4, 8, 16, 32; "
                                   "the mimetic start first drops at x = 16 below 0.9")
    assert [r[:2] for r in rows] == [["attention", "KV cache"], ["mamba N=16", 2048], ["mamba N=16 mimetic", 2048]]
    data, _ = tabulate(who, found([1.0, 1.0, 1.0, 1.0, 0.5]), groups, "accuracy", XS, dim=64, reference="attention")
    assert data["verdict"] == "invalid" and not any("mimetic" in r for r in data["reasons"])


def test_the_committed_study_runs_are_the_runs_this_seqzoo_plans():
    """docs/experiments.md's tables are rebuilt from the committed runs by the same command that
    trains them, at whatever commit runs it; a run whose stored recipe differs from the one planned
    now would be thrown away and trained again (``compare._prepare_folder``). So every committed
    recipe.yaml under docs/experiments/{recall,copying} must be the planned run's, once resolved:
    a change to the studies' shapes, bases or defaults fails here, not after hours of retraining."""
    from pathlib import Path

    import yaml

    from seqzoo.lab import copying, recall
    from seqzoo.lab.compare import Arm, _same_recipe, plan
    from seqzoo.lab.sweep import run_name

    root = Path(__file__).resolve().parents[1] / "docs" / "experiments"
    checked = 0
    for name, module in (("recall", recall), ("copying", copying)):
        shape, design = module.FULL, module.design(module.FULL)
        for layers in shape["layers"]:
            stored = sorted((root / name / f"layers{layers}" / "runs").glob("*/seed*/recipe.yaml"))
            if not stored:
                continue
            arms = [Arm(run_name(c, rate), "tiny-llama", (*design["base"](layers), *c.overrides, f"train.lr={rate}"))
                    for c in design["contenders"](layers) for rate in shape["rates"]]
            planned = {run.folder / "recipe.yaml": run.recipe
                       for run in plan(arms, root / name / f"layers{layers}", steps=shape["steps"],
                                       seeds=shape["seeds"], overrides=design["train"], match_params=True,
                                       log=lambda _: None).runs}
            for path in stored:
                assert path in planned, f"{path}: a committed run that the study no longer plans"
                assert _same_recipe(yaml.safe_load(path.read_text(encoding="utf-8")), planned[path]), \
                    f"{path}: its recipe is not the one the study plans now; the study would train it again"
                checked += 1
    assert checked >= 48  # 21 recall and 27 copying recipes were committed when this test was written


def test_the_compute_counts_every_run_once_by_its_own_training_clock(monkeypatch):
    """A study's compute is the sweep's runs and the seeds' runs, seed 0 at the best rate once, each
    by its training clock (``train_seconds``), not by its wall time."""
    def fake_compare(arms, folder, *, seeds, **_):
        return {"runs": [{"arm": arm.name, "seed": seed, "parameters": 10, "train_seconds": 600.0 * (1 + seed),
                          "wall_seconds": 1.0, "eval": {"loss": 1.0, "groups": {"N=4": {
                              "accuracy": 0.5 if arm.name.endswith("0.001") else 0.1}}}}
                         for arm in arms for seed in seeds]}

    monkeypatch.setattr("seqzoo.lab.sweep.compare", fake_compare)
    found = study(WHO[:2], [], [], rates=[1e-3, 3e-3], seeds=[0, 1, 2], steps=1, folder="unused", metric="accuracy")
    assert found["best"] == {"attention": 1e-3, "mamba N=4": 1e-3}
    # 2 models × 2 rates on seed 0 (600 s each), then seeds 1 and 2 at the best rate (1,200 and 1,800 s)
    assert found["compute"] == {"runs": 8, "seconds": 4 * 600.0 + 2 * (1200.0 + 1800.0)}
    assert compute_line(found["compute"], {"runs": 2, "seconds": 600.0}) == "10 runs, 2.5 hours of training"
    depths = Depths([], {"2": {"verdict": "supported", "reasons": ["why"]}}, {"2": found}, "supported")
    assert depths.notes() == ["2 layers: supported — why",
                              "compute: 8 runs, 2.3 hours of training (2 layers: 8 runs, 2.3 hours of training)"]
