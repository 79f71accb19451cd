"""`seqzoo experiment`: every experiment's quick mode writes its table (markdown, JSON) and PNG;
the scoring and the gradient measurement agree with worked examples and the chain rule."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

import seqzoo
from seqzoo import reference
from seqzoo.cli import main
from seqzoo.lab.experiments import EXPERIMENTS, ExperimentResult, _scores, gradient_by_distance

pytest.importorskip("matplotlib")


# copying's quick run takes about a minute; recall's runs the same study machinery in the default suite;
# delta-rule reads the first study's runs, so tests/test_delta_study.py runs it after them
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "copying" else n
                                  for n in sorted(EXPERIMENTS) if n != "delta-rule"])
def test_quick_mode_writes_table_json_and_png(tmp_path, capsys, name):
    threads = torch.get_num_threads()
    assert main(["experiment", name, "--quick", "-o", str(tmp_path)]) == 0
    assert torch.get_num_threads() == threads  # the run's thread count is put back
    table = (tmp_path / f"{name}.md").read_text()
    assert table.startswith(f"# {name}") and "|---|" in table and "Run time:" in table
    saved = json.loads((tmp_path / f"{name}.json").read_text())
    assert saved["name"] == name and saved["settings"]["quick"] is True
    assert len(saved["rows"]) >= 2 and all(len(r) == len(saved["columns"]) for r in saved["rows"])
    from matplotlib.image import imread

    image = imread(str(tmp_path / f"{name}.png"))
    assert 350 <= image.shape[0] <= 500 and 600 <= image.shape[1] <= 1100 and image.std() > 0.01
    assert "|---|" in capsys.readouterr().out  # the table is printed too
    if name == "copying":  # its quick shape has the trainability control: a row of its own, and
        # no reading of it on a table that 4 steps leave invalid
        assert [r[1] for r in saved["rows"]] == ["attention hard-ALiBi", "mamba N=4", "mamba N=4 mimetic"]
        assert "invalid" in saved["notes"][0] and "mimetic" not in " ".join(saved["notes"])


def test_workers_caps_how_many_runs_a_study_trains_at_once_and_report_only_trains_nothing(tmp_path, capsys):
    assert main(["experiment", "recall", "--quick", "--workers", "1", "-o", str(tmp_path)]) == 0
    log = capsys.readouterr().err
    assert "(1 running, 1 waiting" in log and "2 running" not in log
    trained = json.loads((tmp_path / "recall.json").read_text())

    # --report-only rebuilds the same table from the finished runs, and trains nothing
    results = sorted(tmp_path.glob("layers*/runs/*/seed*/result.json"))
    stamps = [path.stat().st_mtime_ns for path in results]
    assert main(["experiment", "recall", "--quick", "--report-only", "-o", str(tmp_path)]) == 0
    assert "training" not in capsys.readouterr().err
    rebuilt = json.loads((tmp_path / "recall.json").read_text())
    assert rebuilt["rows"] == trained["rows"] and rebuilt["data"] == trained["data"]
    assert rebuilt["settings"]["report_only"] is True
    assert "nothing trained" in (tmp_path / "recall.md").read_text()
    assert [path.stat().st_mtime_ns for path in results] == stamps

    # a run that has not finished: one line naming it, exit 2, and still nothing trained
    gone = results[-1]
    gone.unlink()
    assert main(["experiment", "recall", "--quick", "--report-only", "-o", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"seqzoo: error: {gone.parents[3]}: 1 run(s) have not finished (")
    assert all(line.startswith("match params: ") for line in err[:-1])  # the plan's log, then the one line
    assert unfinished_folder(err[-1], tmp_path) == gone.parent and not gone.exists()


def unfinished_folder(error: str, root: Path) -> Path:
    """The folder of the first run a --report-only refusal names: ROOT/layersL/runs/ARM/seedS."""
    from seqzoo.lab.compare import slug

    found = re.search(r"seqzoo: error: (\S+): \d+ run\(s\) have not finished \((.+?) seed (\d+)[,)]", error)
    assert found, error
    folder, label, seed = found.groups()
    return root / Path(folder).relative_to(root) / "runs" / slug(label) / f"seed{seed}"


def test_report_only_of_a_folder_without_runs_is_refused_before_any_planning(tmp_path, capsys):
    typo = tmp_path / "recal"
    assert main(["experiment", "recall", "-o", str(typo), "--report-only"]) == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == (f"seqzoo: error: {typo}: no finished runs to report; give the folder the runs "
                                    f"trained into as -o, or train them: the same command without --report-only")
    assert captured.out == "" and not typo.exists()


def test_several_names_are_all_checked_before_the_first_runs(tmp_path, capsys):
    assert main(["experiment", "vanishing-gradients", "extrapolaton", "--quick", "-o", str(tmp_path / "x")]) == 2
    assert "unknown experiment 'extrapolaton'; did you mean 'extrapolation'?" in capsys.readouterr().err
    assert main(["experiment", "recall", "surgery", "--report-only", "-o", str(tmp_path / "x")]) == 2
    assert "the surgery experiment keeps no runs to report from" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_report_only_is_refused_for_an_experiment_that_keeps_no_runs(tmp_path, capsys):
    assert main(["experiment", "vanishing-gradients", "--quick", "--report-only", "-o", str(tmp_path)]) == 2
    assert "keeps no runs to report from; only recall, copying, delta-rule, moe do" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["recall", "copying"])
def test_the_committed_study_is_rebuilt_from_its_files_without_training(name, tmp_path, capsys):
    """`seqzoo experiment NAME --report-only` on the committed runs (a copy of their recipes and
    results) trains nothing. Once every run has finished, the table it rebuilds is the committed
    NAME.json's; until then it refuses in one line that names a run whose result is not committed."""
    root = Path(__file__).resolve().parents[1] / "docs" / "experiments" / name
    for path in root.glob("layers*/runs/*/seed*/*"):
        if path.name in ("recipe.yaml", "result.json"):
            copy = tmp_path / path.relative_to(root)
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_bytes(path.read_bytes())
    code = main(["experiment", name, "--report-only", "-o", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert "training" not in err and not list(tmp_path.glob("layers*/runs/*/seed*/model.safetensors"))
    if (root / f"{name}.json").exists():  # the study has finished
        assert code == 0, err
        committed = json.loads((root / f"{name}.json").read_text())
        assert json.loads((tmp_path / f"{name}.json").read_text())["rows"] == committed["rows"]
        return
    assert code == 2  # a run the study plans whose result is not among the committed files
    named = unfinished_folder(err.splitlines()[-1], tmp_path)
    assert not (named / "result.json").exists() and not (root / named.relative_to(tmp_path) / "result.json").exists()


def test_unknown_experiment_exits_2_with_a_suggestion(tmp_path, capsys):
    assert main(["experiment", "extrapolaton", "-o", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "seqzoo: error: unknown experiment 'extrapolaton'; did you mean 'extrapolation'?"
    assert not list(tmp_path.iterdir())


def test_bad_thread_count_exits_2(tmp_path, capsys):
    assert main(["experiment", "vanishing-gradients", "--quick", "--threads", "0", "-o", str(tmp_path)]) == 2
    assert "threads=0 must be >= 1" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["moe", "recall", "vanishing-gradients"])
def test_no_workers_exits_2_before_anything_trains(tmp_path, capsys, name):
    assert main(["experiment", name, "--quick", "--workers", "0", "-o", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == "seqzoo: error: --workers must be >= 1, got 0"
    assert not list(tmp_path.iterdir())


def test_scores_are_exact_match_and_per_character_accuracy():
    pairs = [("abc", "abc"), ("ab", "ba"), ("xyz", "zyx")]
    predictions = ["abc", "bb", "z"]  # right; 1 of 2 characters; 1 of 3 (too short)
    exact, per_char = _scores(pairs, predictions)
    assert exact == pytest.approx(1 / 3)
    assert per_char == pytest.approx((3 + 1 + 1) / 8)


def test_markdown_table_formats_small_numbers_in_scientific_form():
    result = ExperimentResult("x", "t", ["a", "b", "c"], [["rnn", 0.5, 1.25e-5]], {})
    assert result.markdown().splitlines() == ["| a | b | c |", "|---|---|---|", "| rnn | 0.500 | 1.25e-05 |"]


def test_gradient_by_distance_follows_the_chain_rule_for_a_tanh_rnn():
    """For h_t = tanh(W_ih x_t + b_ih + W_hh h_{t−1} + b_hh) and L = Σ_b u·h_T:
    ∂L/∂h_T = u and ∂L/∂h_{t−1} = W_hhᵀ ((1 − h_t²) ⊙ ∂L/∂h_t), row by row."""
    cell = seqzoo.registry().create("cell", "rnn", 3, 5)
    steps, batch = 6, 2
    norms = gradient_by_distance(cell, steps, batch, torch.Generator().manual_seed(7))
    generator = torch.Generator().manual_seed(7)  # the same draws, in the same order
    x = torch.randn(batch, steps, 3, generator=generator, dtype=torch.float64).float()
    u = torch.nn.functional.normalize(torch.randn(5, generator=generator, dtype=torch.float64), dim=0).float()
    with torch.no_grad():
        hs, _ = reference.rnn(x, cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh)  # h_1..h_T (B, T, H)
        grad, expected = u.expand(batch, 5), []
        for t in reversed(range(steps)):
            expected.append(grad.norm(dim=-1).mean())
            grad = ((1 - hs[:, t] ** 2) * grad) @ cell.weight_hh
    torch.testing.assert_close(norms, torch.stack(expected), rtol=1e-5, atol=1e-7)


# -- linear-time and recall: their measurements ------------------------------------------------------
def test_peak_memory_counts_what_is_alive_at_once():
    from seqzoo.lab.measure import peak_memory_mb

    def work():
        a = torch.ones(1 << 20)          # 4 MiB
        b = a * 2                        # 8 MiB alive
        del a
        c = b + 1                        # b and c: 8 MiB again, never 12
        return float(c.sum())

    assert peak_memory_mb(work) == pytest.approx(8.0, abs=0.05)


def test_loglog_slope_and_a_solved_parameter_count():
    from seqzoo.lab.measure import loglog_slope, match_parameters, parameters

    xs = [256, 512, 1024, 4096]
    assert loglog_slope(xs, [3 * x ** 2 for x in xs]) == pytest.approx(2.0)
    assert loglog_slope(xs, [7 * x + 0 for x in xs]) == pytest.approx(1.0)

    swiglu = ["model.ffn={kind: swiglu, hidden: 100}"]
    # each unit of SwiGLU width is 3·C = 192 parameters in each of 4 layers: 768
    exact = parameters(seqzoo.build("tiny-mamba", swiglu, device="meta"))
    assert match_parameters("tiny-mamba", swiglu, exact) == ["model.ffn.hidden=100"]
    assert match_parameters("tiny-mamba", swiglu, exact + 300) == ["model.ffn.hidden=100"]  # nearer 100 than 101
    assert match_parameters("tiny-mamba", swiglu, exact + 500) == ["model.ffn.hidden=101"]
    assert match_parameters("tiny-mamba", swiglu, 1000) == ["model.ffn.hidden=8"]  # below the least width
    moe = ["model.ffn={kind: moe, experts: 4, top_k: 2, expert: {kind: swiglu, hidden: 32}}"]
    assert match_parameters("tiny-mamba", moe, parameters(seqzoo.build("tiny-mamba", moe, device="meta"))) == [
        "model.ffn.expert.hidden=32"]  # a mixture's experts are what is solved
    with pytest.raises(seqzoo.InputError, match="tiny-mamba has no FFN width to solve"):
        match_parameters("tiny-mamba", [], exact)
