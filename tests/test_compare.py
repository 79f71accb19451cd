"""`seqzoo compare`: prepare → compare end to end on a small corpus, the same rows for every model,
matched parameter counts, resumption that retrains only what did not finish, the tables, and the
refusals made before anything trains."""
from __future__ import annotations

import json
import re
import sys

import pytest

import seqzoo
from seqzoo.cli import main
from seqzoo.lab.compare import Arm, CompareError, arm_names, plan
from seqzoo.lab.compare_results import markdown

SMALL = ["model.dim=32", "model.layers=2", "model.attention.heads=2", "train.batch_size=4", "train.task.seq_len=32",
         "train.eval_examples=8", "train.log_every=2"]


@pytest.fixture
def data(grammar_shards) -> str:
    return grammar_shards


def args(*extra: str) -> list[str]:
    return [item for override in SMALL for item in ("--set", override)] + list(extra)


def test_prepare_then_compare_writes_the_table_and_figures_and_resumes(data, tmp_path, capsys):
    out = tmp_path / "cmp"
    command = ["compare", "tiny-gpt", "tiny-llama", "--data", data, "--steps", "6", "--seeds", "0,1",
               "--workers", "2", "--threads", "1", "-o", str(out), *args()]
    assert main(command) == 0
    printed = capsys.readouterr()
    results = json.loads((out / "results.json").read_text())
    assert sorted((r["arm"], r["seed"]) for r in results["runs"]) == [("tiny-gpt", 0), ("tiny-gpt", 1),
                                                                      ("tiny-llama", 0), ("tiny-llama", 1)]
    for run in results["runs"]:
        assert run["steps"] == 6 and run["curve"][-1]["tokens"] == 6 * 4 * 32
        assert run["eval"]["perplexity"] > 1 and run["tokens_per_s"] > 0 and run["flops_per_token"] > 0
        assert [e["step"] for e in run["curve"] if "eval" in e] == [1, 2, 3, 4, 5, 6]  # every tenth, at least 1
    table = (out / "results.md").read_text()
    assert table.startswith("| model | params | params w/o embeddings | FLOPs/token | tokens/s | peak memory (MB) | "
                            "held-out loss | perplexity | wall time (s) |")
    assert " ± " in table and "Budget: 6 steps" in table and "Measured on" in table
    assert table.splitlines()[0] in printed.out
    pytest.importorskip("matplotlib")
    assert (out / "loss-tokens.png").exists() and (out / "loss-seconds.png").exists()

    # Interrupted: one run's result is lost. The same command trains that run alone.
    (out / "runs" / "tiny-llama" / "seed1" / "result.json").unlink()
    stamp = (out / "runs" / "tiny-gpt" / "seed0" / "result.json").stat().st_mtime_ns
    assert main(command) == 0
    log = capsys.readouterr().err
    assert "3 of 4 run(s) already finished; training the other 1" in log
    assert "tiny-llama seed 1: training" in log and "tiny-gpt seed 0: training" not in log
    assert (out / "runs" / "tiny-gpt" / "seed0" / "result.json").stat().st_mtime_ns == stamp


def test_every_model_of_a_seed_reads_the_same_rows_and_seeds_differ(data, tmp_path):
    comparison = plan([Arm("a", "tiny-gpt"), Arm("b", "tiny-llama")], tmp_path, steps=3, seeds=[0, 1], data=data,
                      overrides=SMALL)
    by = {(r.arm, r.seed): r for r in comparison.runs}
    tokenizer = seqzoo.registry().create("tokenizer", "bytes")

    def rows(run):
        task = seqzoo.registry().create("task", run.recipe["train"]["task"])
        task.bind(tokenizer, 259, run.recipe["train"]["seed"])
        return task.batch(0, 4)["ids"]

    assert rows(by[("a", 0)]).equal(rows(by[("b", 0)]))
    assert not rows(by[("a", 0)]).equal(rows(by[("a", 1)]))


def test_match_params_solves_each_ffn_width_to_the_first_models_count(data, tmp_path):
    comparison = plan([Arm("gpt", "tiny-gpt"), Arm("llama", "tiny-llama"), Arm("moe", "tiny-moe")], tmp_path,
                      steps=2, data=data, overrides=SMALL, match_params=True, log=lambda message: None)
    counts = {r.arm: r.parameters for r in comparison.runs}
    assert abs(counts["llama"] - counts["gpt"]) <= 2 * 32 * 3 and abs(counts["moe"] - counts["gpt"]) <= 4 * 32 * 3 * 2
    unmatched = plan([Arm("gpt", "tiny-gpt"), Arm("llama", "tiny-llama")], tmp_path, steps=2, data=data,
                     overrides=SMALL)
    assert {r.arm: r.parameters for r in unmatched.runs}["llama"] != counts["llama"]


def test_different_tokenizers_are_refused_before_anything_trains(data, tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    backend = tokenizers.Tokenizer(tokenizers.models.BPE())
    backend.add_special_tokens(["<|endoftext|>"])
    (tmp_path / "tok.json").write_text(backend.to_str())
    other = Arm("other", "tiny-gpt", (f"tokenizer={{kind: hf, path: {tmp_path / 'tok.json'}, eos_id: 0}}",))
    with pytest.raises(CompareError, match=r"gpt and other have different tokenizers \(bytes and hf\)"):
        plan([Arm("gpt", "tiny-gpt"), other], tmp_path / "out", steps=2, data=data, overrides=SMALL)
    assert not (tmp_path / "out").exists()


def test_the_data_window_defaults_to_what_the_model_allows(data, tmp_path):
    """--data on recipes whose models take 48 positions: the tokens task's window is 48, not its
    default 256 (which a learned table of 48 rows could not read)."""
    small = [o for o in SMALL if not o.startswith("train.task.seq_len")] + ["model.max_seq_len=48"]
    comparison = plan([Arm("a", "tiny-gpt"), Arm("b", "tiny-llama")], tmp_path, steps=2, data=data, overrides=small)
    assert {run.recipe["train"]["task"]["seq_len"] for run in comparison.runs} == {48}
    roomy = plan([Arm("a", "tiny-gpt")], tmp_path / "roomy", steps=2, data=data,
                 overrides=[o for o in small if "max_seq_len" not in o] + ["model.max_seq_len=1024"])
    assert roomy.runs[0].recipe["train"]["task"]["seq_len"] == 256  # the task's own default
    out = tmp_path / "m.safetensors"  # seqzoo train --data likewise
    assert main(["train", "tiny-gpt", "--data", data, "-o", str(out), "--quiet", "--set", "train.steps=1",
                 *[item for o in small for item in ("--set", o)]]) == 0
    assert seqzoo.load(out).recipe["train"]["task"]["seq_len"] == 48


def test_without_matplotlib_compare_says_which_figures_it_skipped(data, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # as in an install without seqzoo[plot]
    out = tmp_path / "cmp"
    assert main(["compare", "tiny-gpt", "--data", data, "--steps", "2", "-o", str(out), *args()]) == 0
    err = capsys.readouterr().err
    assert "seqzoo: note: no loss curves drawn: matplotlib is not installed" in err
    assert "pip install 'seqzoo[plot]'" in err and not list(out.glob("*.png"))


def test_a_budget_under_one_step_is_refused(data, tmp_path, capsys):
    assert main(["compare", "tiny-gpt", "tiny-llama", "--data", data, "--tokens", "100", "-o", str(tmp_path / "o"),
                 *args()]) == 2
    assert capsys.readouterr().err.strip() == ("seqzoo: error: --tokens 100 is less than one step (128 tokens: "
                                               "batch_size 4 × seq_len 32 × accumulate 1)")
    assert not (tmp_path / "o").exists()
    with pytest.raises(CompareError, match="--tokens needs a task of fixed-length rows"):
        plan([Arm("gpt", "tiny-gpt")], tmp_path, tokens=1000)
    assert main(["compare", "tiny-gpt", "--steps", "0", "-o", str(tmp_path / "o")]) == 2
    assert "--steps must be >= 1, got 0" in capsys.readouterr().err


def test_models_must_share_the_task(tmp_path):
    with pytest.raises(CompareError, match=r"a and b differ in train.task"):
        plan([Arm("a", "tiny-gpt"), Arm("b", "tiny-gpt", ("train.task={kind: reverse}",))], tmp_path, steps=2)


def test_a_failed_run_is_reported_and_the_others_finish(data, tmp_path, capsys):
    # max_seq_len below the rows' 32 tokens: that model's run fails when it starts training
    broken = Arm("short", "tiny-gpt", ("model.max_seq_len=16",))
    comparison = plan([Arm("gpt", "tiny-gpt"), broken], tmp_path, steps=2, data=data, overrides=SMALL)
    from seqzoo.lab.compare import execute

    with pytest.raises(CompareError, match=r"1 run\(s\) failed: short seed 0; their logs say why"):
        execute(comparison, tmp_path, threads=1, log=lambda message: None)
    assert "seq_len=32 is longer than the model's 16 positions" in (tmp_path / "runs" / "short" / "seed0" /
                                                                    "train.log").read_text()
    results = json.loads((tmp_path / "results.json").read_text())
    assert [r["arm"] for r in results["runs"]] == ["gpt"] and results["unfinished"] == ["short seed 0"]


def test_names_and_the_table_format():
    assert arm_names(["tiny-gpt", "a/llama.yaml", "b/llama.yaml", "llama"]) == ["tiny-gpt", "llama", "llama-2",
                                                                                 "llama-3"]
    results = {"settings": {"steps": 10, "tokens": None, "run_steps": 10, "seeds": [0, 1], "data": "d"},
               "machine": {"cpu": "CPU X", "cores": 2, "torch": "2.x", "gpu": None}, "unfinished": [],
               "runs": [{"arm": "m", "seed": s, "parameters": 1234, "non_embedding": 1000, "flops_per_token": 2e6,
                         "tokens_per_s": 100.0 + s, "peak_memory_mb": 50.0, "wall_seconds": 10.0,
                         "eval": {"loss": loss, "perplexity": 2.0}} for s, loss in ((0, 1.0), (1, 2.0))]}
    row = markdown(results).splitlines()[2]
    assert row == "| m | 1,234 | 1,000 | 2.00M | 100 | 50 | 1.5000 ± 0.7071 | 2.00 ± 0.00 | 10 |"
    # a run resumed by seqzoo before 2026-12-04 kept only its last stretch in wall.json: its wall
    # time is then at least its training clock
    results["runs"][0]["train_seconds"] = 30.0
    assert markdown(results).splitlines()[2].endswith("| 20 |")  # the mean of 30 and 10
    del results["runs"][0]["train_seconds"]
    assert markdown(results).endswith("Measured on CPU X (2 cores), torch 2.x.")
    # a comparison finished on another machine names each machine with its runs
    results["runs"][1]["machine"] = {"cpu": "CPU Y", "cores": 4, "torch": "2.x", "gpu": None}
    assert markdown(results).endswith("Measured on 2 machines, so tokens/s and wall time compare only within one "
                                      "— CPU X (2 cores), torch 2.x: m seed 0; CPU Y (4 cores), torch 2.x: m seed 1.")


def test_a_finished_run_survives_a_setting_that_a_later_version_adds(data, tmp_path, capsys):
    """A finished run's stored recipe lacks a key the planned one has at its default (as when
    seqzoo gains a setting): it stays finished; a changed value starts it over."""
    import yaml

    out = tmp_path / "cmp"
    command = ["compare", "tiny-gpt", "--data", data, "--steps", "2", "--threads", "1", "-o", str(out), *args()]
    assert main(command) == 0
    recipe_file = out / "runs" / "tiny-gpt" / "seed0" / "recipe.yaml"
    stored = yaml.safe_load(recipe_file.read_text())
    del stored["train"]["keep"]  # written by a seqzoo that did not have train.keep yet
    recipe_file.write_text(yaml.safe_dump(stored))
    capsys.readouterr()
    assert main(command) == 0
    assert "1 of 1 run(s) already finished" in capsys.readouterr().err
    assert main([*command, "--set", "train.lr=5.0e-4"]) == 0
    assert ("its recipe changed since the last time (train.lr: 0.001 in the run, 0.0005 planned); starting it over"
            in capsys.readouterr().err)


def test_report_only_tables_the_finished_runs_and_trains_nothing(data, tmp_path, capsys):
    """--report-only: the finished run's row; a run never trained and a run whose recipe changed
    are listed as not finished, and neither is trained nor has its files touched."""
    out = tmp_path / "cmp"
    command = ["compare", "tiny-gpt", "--data", data, "--steps", "2", "--threads", "1", "-o", str(out), *args()]
    assert main(command) == 0
    capsys.readouterr()
    finished = sorted((out / "runs" / "tiny-gpt" / "seed0").iterdir())
    stamps = [path.stat().st_mtime_ns for path in finished]
    report = ["compare", "tiny-gpt", "tiny-llama", "--data", data, "--steps", "2", "--threads", "1", "-o", str(out),
              "--report-only", *args()]
    assert main(report) == 0
    printed = capsys.readouterr()
    assert "training" not in printed.err and not (out / "runs" / "tiny-llama").exists()
    table = (out / "results.md").read_text()
    assert "| tiny-gpt |" in table and "| tiny-llama |" not in table and "Not finished: tiny-llama seed 0." in table
    assert "Not finished: tiny-llama seed 0." in printed.out

    assert main([*report, "--set", "train.lr=5.0e-4"]) == 0  # another recipe than the one tiny-gpt trained
    err = capsys.readouterr().err
    assert "training" not in err and "tiny-gpt seed 0: its result was trained with another recipe" in err
    assert re.search(r"another recipe than the planned one \(train\.lr: [0-9.e-]+ in the run, 0\.0005 planned\)", err)
    assert "Not finished: tiny-gpt seed 0, tiny-llama seed 0." in (out / "results.md").read_text()
    assert sorted((out / "runs" / "tiny-gpt" / "seed0").iterdir()) == finished
    assert [path.stat().st_mtime_ns for path in finished] == stamps

    typo = tmp_path / "cmpp"  # not the folder the runs trained into: refused, and nothing is made
    assert main(["compare", "tiny-gpt", "--data", data, "--steps", "2", "-o", str(typo), "--report-only", *args()]) == 2
    assert f"{typo}: no runs to report" in capsys.readouterr().err and not typo.exists()


def test_a_changed_recipe_is_named_by_its_first_differing_key():
    from seqzoo.lab.compare import _first_difference

    base = {"model": {"layer_types": ["attention", "mamba2", "mamba2"], "dim": 64}, "train": {"lr": 1e-3}}
    changed = {"model": {"layer_types": ["attention", "mamba2", "attention"], "dim": 64}, "train": {"lr": 1e-3}}
    assert _first_difference(base, changed, ()) == (("model", "layer_types", 2), "mamba2", "attention")
    assert _first_difference(base, {**base, "train": {}}, ())[:2] == (("train", "lr"), 1e-3)
    assert _first_difference(base, base, ()) is None


def test_a_missing_data_folder_is_refused_before_any_run_starts(tmp_path, capsys):
    missing = tmp_path / "nodata"
    assert main(["compare", "tiny-gpt", "tiny-llama", "--data", str(missing), "--steps", "2", "-o",
                 str(tmp_path / "out"), *args()]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"seqzoo: error: {missing}: no such data folder; prepare one with `seqzoo data prepare SRC... "
                   f"-o {missing}` (--report-only tabulates finished runs without it)"]
    assert not (tmp_path / "out").exists()


def test_the_shipped_comparison_plans_every_block_at_gpt2s_parameter_count(tmp_path):
    """examples/compare/ as docs/compare.md runs it: every block resolves, passes the like-for-like
    checks, and its FFN width is solved to within 0.6% of GPT-2's count (nothing is built but on
    the meta device)."""
    from pathlib import Path

    folder = Path(__file__).parent.parent / "examples" / "compare"
    names = sorted(p.stem for p in folder.glob("*.yaml") if p.stem not in ("base", "gpt2"))
    assert {"gdn", "kda", "gla", "rwkv7", "xlstm", "lfm2", "griffin"} <= set(names)
    arms = [Arm(name, str(folder / f"{name}.yaml")) for name in ["gpt2", *names]]
    runs = plan(arms, tmp_path, tokens=2_000_000, match_params=True, log=lambda _: None).runs
    target = runs[0].parameters
    for run in runs[1:]:
        assert abs(run.parameters - target) / target < 0.006, (run.arm, run.parameters, target)


@pytest.mark.filterwarnings("ignore:No artists with labels")  # plot is replaced: the legend has nothing
def test_more_arms_than_colours_are_told_apart_by_line_style(tmp_path, monkeypatch):
    """Sixteen arms (docs/compare.md's byte table): matplotlib's ten colours repeat, so the arms past
    the tenth are drawn dashed — no two arms share both colour and style."""
    pytest.importorskip("matplotlib")
    from seqzoo.lab import compare as comparing

    drawn = []
    monkeypatch.setattr("matplotlib.axes.Axes.plot", lambda self, *a, **k: drawn.append((k["color"], k["ls"])))
    runs = [{"arm": f"arm{i}", "curve": [{"step": 1, "tokens": 10, "seconds": 1.0, "eval": {"loss": 2.0 - i / 20}}]}
            for i in range(16)]
    comparing.draw({"runs": runs}, tmp_path)
    per_figure = drawn[:16]
    assert len(set(per_figure)) == 16
    assert per_figure[0] == ("C0", "-") and per_figure[10] == ("C0", "--")


def test_an_interrupted_runs_wall_time_counts_every_stretch(data, tmp_path, monkeypatch):
    """Ctrl-C while a run trains adds that stretch to its wall.json; the run trained again later
    reports the sum, not its last stretch alone. The clock is compare's own, advanced by hand."""
    from types import SimpleNamespace

    from seqzoo.lab import compare

    comparison = plan([Arm("gpt", "tiny-gpt")], tmp_path, steps=2, data=data, overrides=SMALL)
    clock, launched = [100.0], []
    real_launch = compare._launch

    def launch(run, threads):
        launched.append(real_launch(run, threads))
        return launched[-1]

    def interrupt(seconds):
        clock[0] += 30.0
        launched[-1].kill()  # stopped before it saved anything: the next command trains it from the start
        raise KeyboardInterrupt

    monkeypatch.setattr(compare, "_launch", launch)
    monkeypatch.setattr(compare, "time", SimpleNamespace(perf_counter=lambda: clock[0], sleep=interrupt))
    with pytest.raises(KeyboardInterrupt):
        compare.execute(comparison, tmp_path, threads=1, log=lambda message: None)
    wall_file = tmp_path / "runs" / "gpt" / "seed0" / "wall.json"
    assert json.loads(wall_file.read_text()) == {"seconds": 30.0}

    def tick(seconds):
        clock[0] += 1.0
        sys.modules["time"].sleep(seconds)

    monkeypatch.setattr(compare, "time", SimpleNamespace(perf_counter=lambda: clock[0], sleep=tick))
    results = compare.execute(comparison, tmp_path, threads=1, log=lambda message: None)
    second = clock[0] - 130.0
    assert second >= 1.0 and results["runs"][0]["wall_seconds"] == round(30.0 + second, 1)
    assert json.loads(wall_file.read_text()) == {"seconds": 30.0 + second}
