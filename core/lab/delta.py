"""The second study of the recall question: does the delta rule buy recall back?

The first study (``recall``, ``copying``) asks whether a finite state loses random access. The
field's other answer to that loss, besides adding attention, changed how the state is written:
the delta rule overwrites the value stored under a key instead of adding to it (Gated DeltaNet, the
linear layer of Qwen3-Next, Qwen3.5 and OLMo-Hybrid). This study trains ``gated_deltanet`` on the
same tasks with the same machinery and compares it, at equal state floats per layer, with the first
study's Mamba runs and against its attention runs, which are read from their files, not trained
again. docs/experiments.md states the design and the criteria below before any run.

- Tasks: MQAR at two layers (C = 128) and copying at four (C = 64), the first study's shapes,
  budgets, optimizer and rate sweep (``recall.FULL``, ``copying.FULL``).
- Models: Gated DeltaNet with heads of D_k = D_v = 32 and of 64, C / 32 heads, no position scheme;
  H · D_k · D_v state floats per layer: 4,096 and 16,384 at C = 128, 2,048 and 8,192 at C = 64 —
  exactly Mamba's 2C · N at d_state 16 and 64 (and Mamba-2's, heads of 16, expand 2).
- The criteria, ``verdict``: see its docstring.

``seqzoo experiment delta-rule -o docs/experiments/delta-rule`` reads the first study's runs from
``recall/`` and ``copying/`` beside its own folder and trains only the Gated DeltaNet runs, kept in
``recall/layers2/runs/...`` and ``copying/layers4/runs/...`` under it, so it continues where it
stopped, like the first study.
"""
from __future__ import annotations

import json
import os
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from ..errors import InputError
from . import copying, recall
from .compare import slug
from .measure import match_parameters
from .result import ExperimentResult
from .sweep import (
    CLOSE,
    GAP,
    OPTIMIZER,
    Contender,
    best_rates,
    compute_line,
    invalid,
    line_style,
    per_group,
    run_name,
    study,
)
from .sweep import state_floats as ssm_floats  # Mamba's 2C·N, beside this module's own state_floats

#: The key widths of the two state sizes, each with the Mamba d_state it matches in floats: heads of
#: 32 match d_state 16, heads of 64 d_state 64.
HEAD_DIMS = {32: 16, 64: 64}
#: The quick run's (the tests'): heads of 8 beside the quick shapes' Mamba N=4 (not equal in floats).
QUICK_HEAD_DIMS = {8: 4}
#: Each task: the first study's module and the depth this study runs it at (quick: the quick shape's).
TASKS = {"recall": (recall, 2), "copying": (copying, 4)}


def contenders(dim: int, widths: dict[int, int] = HEAD_DIMS) -> list[Contender]:
    """Gated DeltaNet at each head width of ``widths``, C / 32 heads (at least one; the smaller
    state first); a contender's ``state`` is its head width D_k."""
    heads = max(1, dim // 32)
    return [Contender(f"gated deltanet D_k={width}", "gated_deltanet", width,
                      (f"model.mixer={{kind: gated_deltanet, heads: {heads}, head_dim: {width}}}",
                       "model.position=none"))
            for width in widths]


def state_floats(contender: Contender, dim: int) -> int:
    """A Gated DeltaNet layer's recurrent state in floats: H heads of D_k × D_v (D_v = D_k here).
    (The short convolution's window of K − 1 inputs is on top, as it is for Mamba.)"""
    return max(1, dim // 32) * contender.state ** 2


def verdict(means: dict[str, list[float]], xs: list[int], *, pairs: list[tuple[str, str, int]], reference: str,
            largest: int | None = None) -> tuple[str, list[str]]:
    """The pre-registered criteria for one task -> (verdict, the reasons, one line each).

    ``means[name]``: a model's mean score over seeds at each x (N, or string length; ascending);
    ``pairs``: (gated deltanet, its equal-state Mamba curve, the largest x its state allows), the
    smaller state first; the Mamba curve is the better of Mamba and Mamba-2 at that state, at each x;
    ``largest``: the x the gap is read at (default the last; copying reads it at the longest
    trained length).
    - buys recall back: at the smaller state, gated delta ends at least GAP above Mamba at
      ``largest``; and at every state it is no more than CLOSE below ``reference`` at every x up to
      the x its state allows;
    - does not: at every state, gated delta is within CLOSE of Mamba at every x;
    - inconclusive: anything else.
    """
    largest = xs[-1] if largest is None else largest
    at = xs.index(largest)
    ref = means[reference]
    small, small_mamba, _ = pairs[0]
    gap = means[small][at] - means[small_mamba][at]
    reasons = [f"{small} {gap:+.3f} against {small_mamba} at x = {largest} ({'≥' if gap >= GAP else '<'} {GAP})"]
    close_to_reference = True
    for delta, _, allowed in pairs:
        shortfall = max(r - d for x, r, d in zip(xs, ref, means[delta]) if x <= allowed)
        close_to_reference &= shortfall <= CLOSE
        reasons.append(f"{delta}: at most {shortfall:.3f} below {reference} up to x = {allowed} "
                       f"({'≤' if shortfall <= CLOSE else '>'} {CLOSE})")
    same = True
    for delta, mamba, _ in pairs:
        apart = max(abs(d - m) for d, m in zip(means[delta], means[mamba]))
        same &= apart <= CLOSE
        reasons.append(f"{delta}: at most {apart:.3f} from {mamba} at any x")
    if gap >= GAP and close_to_reference:
        return "buys recall back", reasons
    return ("does not" if same else "inconclusive"), reasons


def overall(verdicts: list[str]) -> str:
    """Across the two tasks, as the first study reads its depths: invalid if either task's table
    is; buys recall back only if both do; does not if either does not; inconclusive otherwise."""
    if "invalid" in verdicts:
        return "invalid"
    if all(v == "buys recall back" for v in verdicts):
        return "buys recall back"
    return "does not" if "does not" in verdicts else "inconclusive"


def better_of(*curves: list[float]) -> list[float]:
    """The best score at each x over several models' curves (Mamba's and Mamba-2's at one state)."""
    return [max(values) for values in zip(*curves)]


def first_study(module, shape: dict, layers: int, folder: str) -> dict:
    """The first study's finished runs of its reference and its pure state-space models at
    ``layers``, read from ``folder`` (its ``-o``) -> {"who", "sweep", "best", "runs", "parameters"}
    as ``sweep.study`` gives them, the best rate chosen by the same rule. Nothing trains: a missing
    run is an InputError that names it."""
    design = module.design(shape)
    who = [c for c in design["contenders"](layers) if c.name == design["reference"] or c.pure_ssm]
    root = Path(folder) / f"layers{layers}" / "runs"

    def read(contender: Contender, rate: float, seed: int) -> dict:
        path = root / slug(run_name(contender, rate)) / f"seed{seed}" / "result.json"
        if not path.exists():
            raise InputError(f"{path}: this run of the first study has not finished; the second study reuses it, so "
                             f"finish the first (seqzoo experiment {module.__name__.rsplit('.', 1)[-1]} -o {folder})")
        return json.loads(path.read_text(encoding="utf-8"))

    rates, seeds = shape["rates"], shape["seeds"]
    sweep, best = best_rates(who, rates, {run_name(c, r): read(c, r, seeds[0]) for c in who for r in rates},
                             design["metric"])
    found = {c.name: [read(c, best[c.name], seed) for seed in seeds] for c in who}
    return {"who": who, "sweep": sweep, "best": best, "runs": found,
            "parameters": {name: runs[0]["parameters"] for name, runs in found.items()}}


def delta_rule(quick: bool = False, log: Callable[[str], None] = print, folder: str | None = None,
               workers: int | None = None, report_only: bool = False) -> ExperimentResult:
    """Run (or continue) the second study on both tasks; the table, the verdicts and the figure's data."""
    folder = folder or tempfile.mkdtemp(prefix="seqzoo-delta-rule-")
    beside = os.path.dirname(os.path.abspath(folder))
    widths = QUICK_HEAD_DIMS if quick else HEAD_DIMS
    rows, tasks, spent = [], {}, []
    for task, (module, depth) in TASKS.items():
        shape = module.QUICK if quick else module.FULL
        layers = shape["layers"][0] if quick else depth
        design = module.design(shape)
        first = first_study(module, shape, layers, os.path.join(beside, task))
        base, reference, groups, xs = design["base"](layers), design["reference"], design["groups"], design["xs"]
        target = first["parameters"][reference]  # the FFN widths solved to the first study's count
        gdn = [replace(c, overrides=(*c.overrides, *match_parameters("tiny-llama", [*base, *c.overrides], target,
                                                                     c.name)))
               for c in contenders(shape["dim"], widths)]
        found = study(gdn, base, design["train"], rates=shape["rates"], seeds=shape["seeds"], steps=shape["steps"],
                      folder=os.path.join(folder, task, f"layers{layers}"), metric=design["metric"], log=log,
                      threads=torch.get_num_threads(), workers=workers, report_only=report_only)
        spent.append(found["compute"])
        runs = {**first["runs"], **found["runs"]}
        table = {name: per_group(seeds, design["metric"]) for name, seeds in runs.items()}
        means = {name: [statistics.fmean(values[g]) for g in groups] for name, values in table.items()}
        pairs = []
        for contender, state in zip(gdn, widths.values()):
            same = [c.name for c in first["who"] if c.pure_ssm and c.state == state]
            mamba = f"{' / '.join(same)}, the better"
            means[mamba] = better_of(*(means[name] for name in same))
            pairs.append((contender.name, mamba, contender.state))
        unsolved = invalid([list(seed) for seed in zip(*[table[reference][g] for g in groups])], xs,
                           reference=reference, checked=design["checked"])
        largest = max(design["checked"]) if design["checked"] else None
        outcome, reasons = (("invalid", [unsolved]) if unsolved else
                            verdict(means, xs, pairs=pairs, reference=reference, largest=largest))
        best = {**first["best"], **found["best"]}
        parameters = {**first["parameters"], **found["parameters"]}
        for contender in [*first["who"], *gdn]:
            name, values = contender.name, table[contender.name]
            floats = state_floats(contender, shape["dim"]) if contender in gdn else ssm_floats(contender, shape["dim"])
            scores = "; ".join(f"{g} {statistics.fmean(values[g]):.3f} ± {statistics.pstdev(values[g]):.3f}"
                               for g in groups)
            rows.append([task, name, floats or "KV cache", parameters[name], f"{best[name]:g}", scores,
                         " / ".join(f"{v:.2f}" for v in values[groups[-1]])])
        tasks[task] = {"layers": layers, "xs": xs, "reference": reference, "means": means, "per_seed": table,
                       "pairs": pairs, "best": best, "verdict": outcome, "reasons": reasons,
                       "family": {c.name: c.family for c in [*first["who"], *gdn]}}
    verdicts = [t["verdict"] for t in tasks.values()]
    columns = ["task", "model", "state floats / layer", "params", "best lr", "score by group (mean ± sd over seeds)",
               "last group per seed"]
    settings = {"head_dims": widths, "tasks": {task: depth for task, (_, depth) in TASKS.items()},
                "optimizer": OPTIMIZER, "reference_runs": "the first study's, read from its folders beside this one"}
    notes = [f"{task}: {t['verdict']} — " + "; ".join(t["reasons"]) for task, t in tasks.items()]
    notes.append(f"compute: {compute_line(*spent)} "
                 f"(the Gated DeltaNet runs; the reference runs are the first study's)")
    return ExperimentResult("delta-rule", f"Does the delta rule buy recall back? Gated DeltaNet at Mamba's state "
                            f"floats on MQAR and copying — verdict: {overall(verdicts)}", columns, rows, settings,
                            {"tasks": tasks, "verdict": overall(verdicts)}, notes)


def draw(result: ExperimentResult, fig) -> None:
    """One panel per task: the score against N (or length) of the reference, Mamba's better curve at
    each state and Gated DeltaNet at each state, the matched pairs in one colour."""
    tasks = result.data["tasks"]
    axes = fig.subplots(1, len(tasks), squeeze=False)[0]
    for ax, (task, data) in zip(axes, tasks.items()):
        ax.plot(data["xs"], data["means"][data["reference"]], marker="o", ms=4, color="black", ls="--",
                label=data["reference"])
        for index, (delta, mamba, _) in enumerate(data["pairs"]):
            ax.plot(data["xs"], data["means"][mamba], marker="o", ms=4, color=f"C{index}", ls=":", label=mamba)
            ax.plot(data["xs"], data["means"][delta], marker="o", ms=4, color=f"C{index}", ls=line_style("ssm"),
                    label=delta)
        ax.set_xscale("log", base=2)
        ax.set_xticks(data["xs"], [str(x) for x in data["xs"]])
        ax.set(xlabel="key–value pairs N" if task == "recall" else "string length", ylim=(-0.02, 1.02),
               ylabel="recall accuracy" if task == "recall" else "strings copied exactly",
               title=f"{task}, {data['layers']} layers: {data['verdict']}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
