"""`seqzoo compare --contenders FILE`: arms that differ in their training recipe (optimizer, rate,
schedule) as well as their model, planned from a contender file; their overrides win over the
command's; the refusals name the file, the entry and the key."""
from __future__ import annotations

import pytest

from seqzoo.cli import main
from seqzoo.lab.compare import CompareError, plan
from seqzoo.lab.contenders import read_contenders, with_contenders

SMALL = ["model.dim=32", "model.layers=2", "model.attention.heads=2", "train.batch_size=4", "train.task.seq_len=32",
         "train.eval_examples=8", "train.lr=1.0e-3"]

CONTENDERS = """
contenders:
  - {name: gpt-adamw, recipe: local.yaml}
  - {name: gpt-muon, recipe: local.yaml, set: [train.optimizer=muon, train.lr=2.0e-3]}
  - {recipe: tiny-llama, set: ["train.schedule={kind: wsd, decay: 0.5}", "train.optimizer={kind: sgd, momentum: 0.8}"]}
"""


@pytest.fixture
def contenders(tmp_path):
    folder = tmp_path / "cmp"
    folder.mkdir()
    (folder / "local.yaml").write_text("seqzoo: 1\nextends: tiny-gpt\nmodel: {layers: 3}\n")
    path = folder / "contenders.yaml"
    path.write_text(CONTENDERS)
    return path


def test_contenders_vary_the_training_recipe_per_arm(contenders, grammar_shards, tmp_path):
    arms = with_contenders(["tiny-gpt"], [str(contenders)])
    assert [arm.name for arm in arms] == ["tiny-gpt", "gpt-adamw", "gpt-muon", "tiny-llama"]
    assert arms[1].recipe == str(contenders.parent / "local.yaml")  # relative to the file, as extends: is
    comparison = plan(arms, tmp_path / "out", steps=4, data=grammar_shards, overrides=SMALL)
    train = {run.arm: run.recipe["train"] for run in comparison.runs}
    assert train["tiny-gpt"]["optimizer"]["kind"] == train["gpt-adamw"]["optimizer"]["kind"] == "adamw"
    assert train["gpt-muon"]["optimizer"]["kind"] == "muon"
    assert train["gpt-muon"]["lr"] == 2e-3 and train["gpt-adamw"]["lr"] == 1e-3  # the contender's own --set wins
    assert train["tiny-llama"]["schedule"] == {"kind": "wsd", "decay": 0.5, "shape": "linear"}
    assert train["tiny-llama"]["optimizer"]["momentum"] == 0.8
    assert {run.recipe["model"]["layers"] for run in comparison.runs if run.arm.startswith("gpt-")} == {2}
    assert list(comparison.settings["arms"][2]["overrides"]) == ["train.optimizer=muon", "train.lr=2.0e-3"]


def test_contenders_still_share_the_data_and_the_budget(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("contenders:\n  - {name: a, recipe: tiny-gpt}\n  - {name: b, recipe: tiny-gpt, "
                    "set: [train.batch_size=8]}\n")
    with pytest.raises(CompareError, match=r"a and b differ in train.batch_size \(32 and 8\)"):
        plan(read_contenders(path), tmp_path, steps=2)


@pytest.mark.parametrize("text, line, message", [
    ("contenders: []", 1, r"expected a mapping with a non-empty list under 'contenders:' \(each entry a mapping"),
    ("contender:\n  - {recipe: tiny-gpt}", 1, r"expected .* under 'contenders:' \(did you mean 'contenders' for "
                                              r"'contender'\?\)"),
    ("contenders:\n  - {recipe: tiny-gpt, sett: [train.lr=1]}", 2, r"contenders\[0\]: unknown key 'sett'; did you "
                                                                     r"mean 'set'\?"),
    ("contenders:\n  - {name: a}", 2, r"contenders\[0\].recipe: expected a recipe path or shipped name, got None"),
    ("contenders:\n  - {recipe: tiny-gpt}\n  - {recipe: nothere.yaml}", 3,
     r"contenders\[1\].recipe: no such file .*nothere.yaml \(a recipe path is relative to the contender file"),
    ("contenders:\n  - {recipe: tiny-gpt, set: train.lr=1}", 2,
     r"contenders\[0\].set: expected a list of KEY.PATH=VALUE"),
    ("contenders:\n  -\n    recipe: tiny-gpt\n    set: [train.lr]", 3,
     r"contenders\[0\].set\[0\]: expected KEY.PATH=VALUE \(such as train.lr=1.0e-3\), got 'train.lr', which has no "
     r"'='"),
    ("contenders:\n  - tiny-gpt", 2, r"contenders\[0\]: expected a mapping of name, recipe and set, got 'tiny-gpt'"),
    ("contenders:\n  - {recipe: tiny-gpt, name: 3}", 2, r"contenders\[0\].name: expected a name, got 3"),
    ("contenders:\n  - {recipe: tiny-gpt}\n  - [", 3, r"invalid YAML"),
])
def test_a_contender_file_that_is_wrong_says_where(tmp_path, text, line, message):
    from seqzoo.errors import SeqzooError

    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(SeqzooError, match=rf"^{path}:{line}: {message}"):
        read_contenders(path)


def test_a_contenders_override_that_is_wrong_names_its_file_and_line(tmp_path, grammar_shards, capsys):
    """A mistake in a contender's `set:` is reported at its line in the contender file (not as the
    command's --set), as a recipe's own mistakes are."""
    path = tmp_path / "c.yaml"
    path.write_text("contenders:\n  - {name: a, recipe: tiny-gpt}\n  - name: b\n    recipe: tiny-gpt\n"
                    "    set: [train.lr=1.0e-3,\n          train.lrr=1.0e-3]\n")
    assert main(["compare", "--contenders", str(path), "--data", grammar_shards, "--steps", "2",
                 "-o", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"seqzoo: error: {path}:6: train.lrr: unknown key 'lrr'; did you mean 'lr'?")


def test_two_arms_of_one_name_and_a_missing_file_are_refused(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("contenders:\n  - {recipe: tiny-gpt, set: [train.lr=1.0e-2]}\n")
    with pytest.raises(CompareError, match=r"two contenders are named 'tiny-gpt'; give each its own name"):
        with_contenders(["tiny-gpt"], [str(path)])
    assert main(["compare", "--contenders", str(tmp_path / "none.yaml"), "--steps", "2"]) == 2
    assert f"--contenders {tmp_path / 'none.yaml'}: cannot read it" in capsys.readouterr().err
    assert main(["compare", "--steps", "2"]) == 2
    assert "seqzoo compare: give the recipes to compare, or --contenders FILE" in capsys.readouterr().err


def test_the_shipped_optimizer_comparison_plans(grammar_shards, tmp_path):
    """examples/compare-optimizers.yaml (docs/compare.md's optimizer section): 21 arms, two blocks under
    AdamW at three rates (and Mamba-2 at 1e-2, past its grid's best), Muon at five and WSD, all on
    one budget, at the FFN widths of the byte-level comparison; planned, nothing trained."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "compare-optimizers.yaml"
    comparison = plan(read_contenders(path), tmp_path, tokens=2_000_000, data=grammar_shards, log=lambda _: None)
    trains = {run.arm: run.recipe["train"] for run in comparison.runs}
    assert len(trains) == 21
    widths = {run.arm: run.recipe["model"]["ffn"]["hidden"] for run in comparison.runs}
    assert all(width == (793 if arm.startswith("llama") else 487) for arm, width in widths.items())
    muon = [arm for arm, t in trains.items() if t["optimizer"]["kind"] == "muon"]
    assert len(muon) == 12 and all("muon" in arm for arm in muon)
    adamw = [arm for arm in trains if arm not in muon and arm != "mamba2-adamw-1e-2"]
    assert {trains[arm]["lr"] for arm in adamw} == {3e-4, 1e-3, 3e-3}
    assert trains["mamba2-adamw-1e-2"]["lr"] == 1e-2 and trains["mamba2-adamw-1e-2"]["optimizer"]["kind"] == "adamw"
    assert {t["lr"] for arm, t in trains.items() if arm in muon} == {3e-4, 1e-3, 3e-3, 1e-2, 3e-2}
    assert [arm for arm, t in trains.items() if t["schedule"]["kind"] == "wsd"] == [
        "llama-adamw-1e-3-wsd", "llama-muon-1e-3-wsd", "mamba2-adamw-1e-3-wsd", "mamba2-muon-1e-3-wsd"]


@pytest.mark.parametrize("subset", ["compare-optimizers-wsd.yaml", "compare-optimizers-best.yaml"])
def test_the_optimizer_figures_subsets_read_the_comparisons_own_runs(subset):
    """The contender files of docs/compare.md's schedule and best-of figures list arms of
    examples/compare-optimizers.yaml, each exactly as it is there (name, recipe and overrides), so
    `--report-only` reads that comparison's runs instead of counting them as other recipes."""
    from pathlib import Path

    examples = Path(__file__).resolve().parents[1] / "examples"
    every = {arm.name: arm for arm in read_contenders(examples / "compare-optimizers.yaml")}
    arms = read_contenders(examples / subset)
    assert len(arms) >= 4 and all(arm == every[arm.name] for arm in arms)


def test_the_best_of_figure_holds_each_optimizers_best_committed_rate():
    """examples/compare-optimizers-best.yaml names, for each block and optimizer, the cosine run with
    the lowest held-out loss among the committed runs of docs/compare/optimizers/runs/."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    losses = {path.parent.parent.name: json.loads(path.read_text())["eval"]["loss"]
              for path in (root / "docs" / "compare" / "optimizers" / "runs").glob("*/seed0/result.json")}
    best = {}
    for name, loss in losses.items():
        block, optimizer, *rate = name.split("-")
        if rate[-1] != "wsd" and loss < losses.get(best.get((block, optimizer)), float("inf")):
            best[(block, optimizer)] = name
    chosen = [arm.name for arm in read_contenders(root / "examples" / "compare-optimizers-best.yaml")]
    assert sorted(chosen) == sorted(best.values()) and len(chosen) == 4
