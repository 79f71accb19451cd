"""The second recall study (seqzoo.lab.delta, issue #37): Gated DeltaNet's state sizes equal the first
study's Mamba states in floats, and the pre-registered verdict against hand-made tables, one per
outcome."""
from __future__ import annotations

import pytest

import seqzoo
from seqzoo.lab import sweep
from seqzoo.lab.delta import better_of, contenders, overall, state_floats, verdict

XS = [4, 8, 16, 32, 64]
ATTENTION = [1.0, 1.0, 0.998, 0.995, 0.99]
PAIRS = [("gated deltanet D_k=32", "mamba N=16", 32), ("gated deltanet D_k=64", "mamba N=64", 64)]


def table(small, large, mamba_small=(1.0, 0.95, 0.8, 0.4, 0.1), mamba_large=(1.0, 1.0, 0.95, 0.8, 0.5)):
    return {"attention": ATTENTION, "gated deltanet D_k=32": list(small), "gated deltanet D_k=64": list(large),
            "mamba N=16": list(mamba_small), "mamba N=64": list(mamba_large)}


@pytest.mark.parametrize("dim, task_layers", [(128, 2), (64, 4)])
def test_the_two_states_equal_mambas_at_d_state_16_and_64_in_floats(dim, task_layers):
    """Heads of 32 and 64 at C / 32 heads hold exactly the 2C·N floats of the first study's Mamba (and
    Mamba-2) at d_state 16 and 64, and the layer the recipe builds has those heads and widths."""
    found = contenders(dim)
    mamba = {c.state: c for c in sweep.state_space_contenders({"mamba": [16, 64], "mamba2": [16, 64]}, False)}
    assert [state_floats(c, dim) for c in found] == [sweep.state_floats(mamba[16], dim),
                                                     sweep.state_floats(mamba[64], dim)]
    for contender in found:
        overrides = [f"model.dim={dim}", f"model.layers={task_layers}", *contender.overrides]
        model = seqzoo.build("tiny-llama", overrides, device="meta")
        mixer = next(m for m in model.modules() if type(m).__name__ == "GatedDeltaNet")
        assert mixer.heads * mixer.head_dim * mixer.value_head_dim == state_floats(contender, dim)


def test_a_table_where_delta_beats_mamba_and_keeps_up_with_attention_buys_recall_back():
    means = table(small=[1.0, 1.0, 0.99, 0.97, 0.5], large=[1.0, 1.0, 0.99, 0.98, 0.96])
    outcome, reasons = verdict(means, XS, pairs=PAIRS, reference="attention")
    assert outcome == "buys recall back"
    assert reasons[0] == "gated deltanet D_k=32 +0.400 against mamba N=16 at x = 64 (≥ 0.2)"
    # the small state is only held to attention up to its D_k = 32: its 0.5 at N = 64 does not count
    assert "gated deltanet D_k=32: at most 0.025 below attention up to x = 32 (≤ 0.05)" in reasons


def test_delta_within_a_seed_of_mamba_everywhere_does_not_buy_recall_back():
    means = table(small=[1.0, 0.97, 0.78, 0.42, 0.12], large=[1.0, 0.99, 0.93, 0.83, 0.47])
    assert verdict(means, XS, pairs=PAIRS, reference="attention")[0] == "does not"


@pytest.mark.parametrize("small, large", [
    ([1.0, 1.0, 0.99, 0.97, 0.25], [1.0, 1.0, 0.99, 0.98, 0.96]),  # the gap at N = 64 is 0.15 < 0.2
    ([1.0, 1.0, 0.90, 0.97, 0.5], [1.0, 1.0, 0.99, 0.98, 0.96]),   # falls 0.098 below attention at N = 16
    ([1.0, 1.0, 0.99, 0.97, 0.5], [1.0, 1.0, 0.99, 0.98, 0.90]),   # the large state misses attention at 64
])
def test_anything_else_is_inconclusive(small, large):
    assert verdict(table(small, large), XS, pairs=PAIRS, reference="attention")[0] == "inconclusive"


def test_copying_reads_the_gap_at_the_longest_trained_length():
    lengths = [8, 16, 32, 64, 128, 256]
    means = {"attention hard-ALiBi": [1.0, 1.0, 0.99, 0.9, 0.2, 0.0],
             "gated deltanet D_k=32": [1.0, 1.0, 0.97, 0.1, 0.0, 0.0],
             "gated deltanet D_k=64": [1.0, 1.0, 0.99, 0.88, 0.1, 0.0],
             "mamba N=16": [0.6, 0.3, 0.1, 0.0, 0.0, 0.0], "mamba N=64": [0.9, 0.7, 0.4, 0.1, 0.0, 0.0]}
    outcome, reasons = verdict(means, lengths, pairs=PAIRS, reference="attention hard-ALiBi", largest=32)
    assert outcome == "buys recall back"
    assert reasons[0].startswith("gated deltanet D_k=32 +0.870 against mamba N=16 at x = 32")
    # read at the last length instead, where every model is at 0, there is no gap to find
    assert verdict(means, lengths, pairs=PAIRS, reference="attention hard-ALiBi")[0] == "inconclusive"


def test_the_rule_across_tasks_and_the_better_mamba():
    assert overall(["buys recall back", "buys recall back"]) == "buys recall back"
    assert overall(["buys recall back", "inconclusive"]) == "inconclusive"
    assert overall(["buys recall back", "does not"]) == "does not"
    assert overall(["invalid", "buys recall back"]) == "invalid"
    assert better_of([0.9, 0.2, 0.5], [0.8, 0.4, 0.5]) == [0.9, 0.4, 0.5]


def test_the_second_study_refuses_to_start_before_the_first_has_finished(tmp_path, capsys):
    """It reuses the first study's runs, and never trains them itself: without them it stops at once
    with one line that names the missing run and the command that makes it."""
    from seqzoo.cli import main

    assert main(["experiment", "delta-rule", "--quick", "-o", str(tmp_path / "delta-rule")]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1
    assert "recall/layers2/runs/attention_lr_0.001/seed0/result.json: this run of the first study has not finished" \
        in error and f"seqzoo experiment recall -o {tmp_path / 'recall'}" in error
    assert not (tmp_path / "recall").exists()  # nothing of the first study's was made


@pytest.mark.slow  # the first study's quick runs (recall and copying, ~1.5 min) and then its own
def test_the_second_study_reads_the_first_and_trains_only_gated_deltanet(tmp_path, capsys):
    import json

    from seqzoo.cli import main

    # several names: each in its own folder under -o, as the second study expects the first's beside it
    assert main(["experiment", "recall", "copying", "--quick", "--workers", "1", "-o", str(tmp_path)]) == 0
    before = {p: p.stat().st_mtime for p in tmp_path.glob("*/layers*/runs/*/seed*/result.json")}
    capsys.readouterr()
    assert main(["experiment", "delta-rule", "--quick", "--workers", "1", "-o", str(tmp_path / "delta-rule")]) == 0
    log = capsys.readouterr().err
    assert "gated deltanet D_k=8" in log and "attention · lr" not in log and "mamba N=4 · lr" not in log
    assert {p: p.stat().st_mtime for p in before} == before  # the first study's runs are read, not touched
    saved = json.loads((tmp_path / "delta-rule" / "delta-rule.json").read_text())
    assert [(r[0], r[1]) for r in saved["rows"]] == [
        ("recall", "attention"), ("recall", "mamba N=4"), ("recall", "gated deltanet D_k=8"),
        ("copying", "attention hard-ALiBi"), ("copying", "mamba N=4"), ("copying", "gated deltanet D_k=8")]
    tasks = saved["data"]["tasks"]
    assert tasks["recall"]["pairs"] == [["gated deltanet D_k=8", "mamba N=4, the better", 8]]
    # four quick steps leave attention unsolved: no comparison is reported, as the rule says
    assert tasks["recall"]["verdict"] == "invalid" and saved["data"]["verdict"] == "invalid"
    # its FFN width is solved to the first study's parameter count
    first = json.loads((tmp_path / "recall" / "recall.json").read_text())
    counts = {r[1]: r[3] for r in first["rows"]}
    ours = {r[1]: r[3] for r in saved["rows"] if r[0] == "recall"}
    assert abs(ours["gated deltanet D_k=8"] - counts["attention"]) / counts["attention"] < 0.02
    # both studies' tables and figures, rebuilt from the kept files by one command, nothing trained
    names = ("recall", "copying", "delta-rule")
    tables = {name: json.loads((tmp_path / name / f"{name}.json").read_text())["rows"] for name in names}
    results = {p: p.stat().st_mtime for p in tmp_path.glob("**/result.json")}
    capsys.readouterr()
    assert main(["experiment", *names, "--quick", "--report-only", "-o", str(tmp_path)]) == 0
    assert "training" not in capsys.readouterr().err
    assert {name: json.loads((tmp_path / name / f"{name}.json").read_text())["rows"] for name in names} == tables
    assert {p: p.stat().st_mtime for p in results} == results and all((tmp_path / n / f"{n}.png").exists()
                                                                      for n in names)
