"""``seqzoo compare``: train several recipes on the same data, windows and budget, and tabulate them.

Every run — one recipe (an *arm*) at one seed — is planned before anything trains: its recipe is
resolved with the shared overrides, the data, the budget and (``match_params``) an FFN width that
gives it the first arm's parameter count; the arms must share a tokenizer and a task, and the
budget must hold at least one step. Each run then trains in a process of its own (``seqzoo
train``), K at a time, into ``OUT/runs/ARM/seedS/``: its resolved recipe, its checkpoint (saved
along the way), its metrics and its log. A run is finished when its ``result.json`` exists, so an
interrupted comparison, run again with the same command, trains only what did not finish —
resuming a run from its last checkpoint — and then rewrites ``results.json``, ``results.md`` and
the figures from the finished runs' files (``seqzoo.lab.compare_results``). With ``report_only``
(``--report-only``) nothing trains: only the table and the figures are rewritten, from the runs
that have finished.

Runs of one seed read the same rows in the same order: the data stream is a function of
``train.seed`` and the row index only, never of the model.
"""
from __future__ import annotations

import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from ..errors import SeqzooError
from ..files import write_text_atomic
from ..interfaces import TokenTask
from ..io.build import instantiate
from ..recipe import resolve
from ..registry import registry, tokenizer
from ..train.token_batches import data_override, fit_window
from .compare_results import draw, machine, markdown
from .measure import match_parameters, non_embedding_parameters, parameters
from .plots import PlotError


class CompareError(SeqzooError):
    """A comparison that cannot run as asked: arms that do not share a tokenizer or task, a budget
    under one step, a run that failed."""


@dataclass(frozen=True)
class Arm:
    """One model of a comparison: a recipe (path, shipped name or dict) and its own overrides."""

    name: str
    recipe: str | dict
    overrides: tuple[str, ...] = ()


@dataclass
class Run:
    """One arm at one seed, resolved: the recipe it trains with and where its files go."""

    arm: str
    seed: int
    recipe: dict
    folder: Path
    parameters: int
    non_embedding: int
    steps: int

    @property
    def label(self) -> str:
        return f"{self.arm} seed {self.seed}"


@dataclass
class Plan:
    runs: list[Run]
    settings: dict = field(default_factory=dict)


def arm_names(recipes: list[str]) -> list[str]:
    """A short, unique name per recipe: its file stem (``tiny-gpt``), numbered when repeated."""
    stems = [Path(r).stem if r.endswith((".yaml", ".yml")) else r for r in recipes]
    names = []
    for stem in stems:
        name, k = stem, 2
        while name in names:
            name, k = f"{stem}-{k}", k + 1
        names.append(name)
    return names


def plan(arms: list[Arm], output: str | Path, *, steps: int | None = None, tokens: int | None = None,
         seeds: list[int] = (0,), data: str | None = None, overrides: list[str] = (),
         match_params: bool = False, log: Callable[[str], None] = print) -> Plan:
    """Resolve every run of the comparison and check that they compare like with like (see the
    module docstring); nothing trains and nothing is written here."""
    if not arms:
        raise CompareError("give at least one recipe to compare")
    if (steps is None) == (tokens is None):
        raise CompareError("give the budget as --steps N or as --tokens N (one of them)")
    if not seeds:
        raise CompareError("give at least one seed")
    budget = [f"train.steps={steps}", "train.tokens=null"] if steps is not None else [f"train.tokens={tokens}"]
    resolved = []
    for arm in arms:
        base = resolve(arm.recipe).data["train"]
        first = ["train={}"] if base is None else []  # a recipe without train: gets the defaults
        if data is not None:  # before the overrides, which may set the data task's own keys
            first.append(data_override(base, data))
        given = [*first, *overrides, *arm.overrides, *budget]
        if data is not None:
            given += fit_window(resolve(arm.recipe, given).data, [*overrides, *arm.overrides])
        resolved.append((arm, given))
    target = None
    runs_by_arm = {}
    for index, (arm, arm_overrides) in enumerate(resolved):
        if match_params and index > 0:
            arm_overrides = [*arm_overrides, *match_parameters(arm.recipe, arm_overrides, target, arm.name)]
        recipe = resolve(arm.recipe, arm_overrides).data
        model = instantiate(resolve(recipe), device="meta")
        count = parameters(model)
        if index == 0:
            target = count
        runs_by_arm[arm.name] = (recipe, count, non_embedding_parameters(model))
    _check_alike(runs_by_arm)
    first_recipe = next(iter(runs_by_arm.values()))[0]
    run_steps = _steps(first_recipe)
    runs = []
    for arm in arms:
        recipe, count, non_embedding = runs_by_arm[arm.name]
        recipe = _with_cadence(recipe, run_steps)
        for seed in seeds:
            seeded = json.loads(json.dumps(recipe))
            seeded["train"]["seed"] = seed
            runs.append(Run(arm.name, seed, seeded, Path(output) / "runs" / slug(arm.name) / f"seed{seed}",
                            count, non_embedding, run_steps))
    settings = {"arms": [asdict(a) for a in arms], "steps": steps, "tokens": tokens, "seeds": list(seeds),
                "data": data, "overrides": list(overrides), "match_params": match_params, "run_steps": run_steps}
    if match_params:
        for arm in arms[1:]:
            log(f"match params: {arm.name} {runs_by_arm[arm.name][1]:,} for {target:,}")
    return Plan(runs, settings)


def slug(name: str) -> str:
    """An arm's folder name under runs/ (what is not a letter, digit, dot, dash or underscore -> _)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def _check_alike(runs: dict[str, tuple[dict, int, int]]) -> None:
    """The arms must read the same data the same way: one tokenizer, one task, one batch shape."""
    names = list(runs)
    first = runs[names[0]][0]
    first_tokenizer = tokenizer(first)
    for name in names[1:]:
        recipe = runs[name][0]
        other = tokenizer(recipe)
        if other.identity() != first_tokenizer.identity():
            raise CompareError(f"{names[0]} and {name} have different tokenizers ({_spec(first['tokenizer'])} and "
                               f"{_spec(recipe['tokenizer'])}), so their losses do not compare; give them one "
                               f"(--set tokenizer=...)")
        budget = ("tokens",) if first["train"].get("tokens") is not None else ("steps", "tokens")
        for key in ("task", "batch_size", "accumulate", *budget):
            if recipe["train"].get(key) != first["train"].get(key):
                raise CompareError(f"{names[0]} and {name} differ in train.{key} ({first['train'].get(key)!r} and "
                                   f"{recipe['train'].get(key)!r}); the runs of a comparison share the data and "
                                   f"budget (set it with --set train.{key}=... for all)")


def _spec(spec) -> str:
    return spec if isinstance(spec, str) else spec.get("kind", "?")


def _steps(recipe: dict) -> int:
    """The steps a run of ``recipe`` takes (a token budget is turned into steps here, so a budget
    under one step is refused before anything trains)."""
    train = recipe["train"]
    if train.get("tokens") is None:
        return train["steps"]
    task = registry().create("task", train["task"])
    if not isinstance(task, TokenTask):
        raise CompareError(f"--tokens needs a task of fixed-length rows (tokens, mqar); the task is "
                           f"{_spec(train['task'])}: give --steps")
    per_step = train["batch_size"] * train.get("accumulate", 1) * task.seq_len
    if train["tokens"] < per_step:
        raise CompareError(f"--tokens {train['tokens']:,} is less than one step ({per_step:,} tokens: batch_size "
                           f"{train['batch_size']} × seq_len {task.seq_len} × accumulate {train.get('accumulate', 1)})")
    return math.ceil(train["tokens"] / per_step)


def _with_cadence(recipe: dict, steps: int) -> dict:
    """Held-out points along the curve and checkpoints to resume from: every tenth of the run
    unless the recipe says otherwise."""
    recipe = json.loads(json.dumps(recipe))
    train = recipe["train"]
    if not train.get("eval_every"):
        train["eval_every"] = max(1, steps // 10)
    if not train.get("save_every"):
        train["save_every"] = max(1, steps // 10)
    return recipe


# -- running -----------------------------------------------------------------------------------------
def execute(comparison: Plan, output: str | Path, *, workers: int = 1, threads: int | None = None,
            log: Callable[[str], None] = print, report_only: bool = False, every_run: bool = False) -> dict:
    """Train every run that has not finished, ``workers`` at a time, each in its own process with
    ``threads`` CPU threads (default: the cores shared out); then write and return the results.
    ``report_only``: train nothing and leave every run folder as it is; the results are the
    finished runs', and the others are listed as unfinished — or, with ``every_run``, a
    CompareError naming them before anything is written."""
    output = Path(output)
    if report_only:
        return _report(comparison, output, log, every_run)
    output.mkdir(parents=True, exist_ok=True)
    threads = threads or max(1, (os.cpu_count() or 1) // max(1, workers))
    pending = []
    for run in comparison.runs:
        if _prepare_folder(run, log):
            pending.append(run)
    done = len(comparison.runs) - len(pending)
    if done:
        log(f"{done} of {len(comparison.runs)} run(s) already finished; training the other {len(pending)}")
    failures = []
    running: list[tuple[Run, subprocess.Popen, float]] = []
    try:
        while pending or running:
            while pending and len(running) < workers:
                run = pending.pop(0)
                running.append((run, _launch(run, threads), time.perf_counter()))
                log(f"{run.label}: training ({len(running)} running, {len(pending)} waiting; "
                    f"log {run.folder / 'train.log'})")
            time.sleep(0.2)
            for item in list(running):
                run, process, started = item
                code = process.poll()
                if code is None:
                    continue
                running.remove(item)
                if code != 0:
                    _add_wall(run, time.perf_counter() - started)
                    failures.append(run)
                    log(f"{run.label}: failed (exit {code}); see {run.folder / 'train.log'}")
                    continue
                result = _finish(run, time.perf_counter() - started)
                log(f"{run.label}: {_result_line(result)}")
    except KeyboardInterrupt:
        for run, process, started in running:
            try:
                process.wait(timeout=60)  # the child got the same Ctrl-C and saves at a step boundary
            except subprocess.TimeoutExpired:
                process.kill()
            _add_wall(run, time.perf_counter() - started)
        raise
    results = collect(comparison, output)
    if failures:
        raise CompareError(f"{len(failures)} run(s) failed: {', '.join(r.label for r in failures)}; their logs say "
                           f"why ({failures[0].folder / 'train.log'}, ...); run the command again to retry them")
    return results


def _report(comparison: Plan, output: Path, log: Callable[[str], None], every_run: bool) -> dict:
    """``execute``'s ``report_only``: the results of the runs in ``output`` that have finished."""
    if not (output / "runs").is_dir():
        raise CompareError(f"{output}: no runs to report (no {output / 'runs'} folder); give the folder the runs "
                           f"trained into as -o, or train them: the same command without --report-only")
    unfinished = [run for run in comparison.runs if not _finished(run)]
    for run in unfinished:
        if (run.folder / "result.json").exists():
            why = (f"was trained with another recipe than the planned one ({_recipe_change(run)})"
                   if (run.folder / "recipe.yaml").exists() else "has no recipe.yaml beside it")
            log(f"{run.label}: its result {why}, so it is not reported")
    if every_run and unfinished:
        shown = ", ".join(run.label for run in unfinished[:3]) + (", ..." if len(unfinished) > 3 else "")
        raise CompareError(f"{output}: {len(unfinished)} run(s) have not finished ({shown}), so there is no table "
                           f"to report; train them with the same command without --report-only")
    return collect(comparison, output)


def _prepare_folder(run: Run, log: Callable[[str], None]) -> bool:
    """Write the run's recipe; True when the run still has to train. A folder whose recipe differs
    from the planned one (another budget, another width) holds a stale run: it starts over."""
    run.folder.mkdir(parents=True, exist_ok=True)
    planned = _stored_recipe_is_planned(run)
    if planned is False:
        log(f"{run.label}: its recipe changed since the last time ({_recipe_change(run)}); starting it over")
        for name in ("model.safetensors", "result.json", "metrics.jsonl", "train.json", "wall.json"):
            (run.folder / name).unlink(missing_ok=True)
    elif planned and (run.folder / "result.json").exists():
        return False  # finished, and its recipe file stays as it trained
    write_text_atomic(run.folder / "recipe.yaml", yaml.safe_dump(run.recipe, sort_keys=False))
    return not (run.folder / "result.json").exists()


def _stored_recipe_is_planned(run: Run) -> bool | None:
    """Whether the run folder's recipe.yaml is the planned recipe; None when there is none."""
    recipe_file = run.folder / "recipe.yaml"
    if not recipe_file.exists():
        return None
    stored = yaml.safe_load(recipe_file.read_text(encoding="utf-8"))
    return isinstance(stored, dict) and _same_recipe(stored, run.recipe)


def _recipe_change(run: Run) -> str:
    """Where the run folder's recipe and the planned one first differ, once both are resolved:
    ``key.path: A in the run, B planned``."""
    stored = yaml.safe_load((run.folder / "recipe.yaml").read_text(encoding="utf-8"))
    if not isinstance(stored, dict):
        return f"its recipe.yaml holds {type(stored).__name__}, not a recipe"
    try:
        stored, planned = resolve(stored).data, resolve(run.recipe).data
    except SeqzooError:
        planned = run.recipe
    path, was, now = _first_difference(stored, planned, ()) or ((), stored, planned)

    def shown(value) -> str:
        text = "absent" if value is _ABSENT else repr(value)
        return text if len(text) <= 60 else text[:57] + "..."
    return f"{'.'.join(map(str, path)) or 'the recipe'}: {shown(was)} in the run, {shown(now)} planned"


_ABSENT = object()


def _first_difference(a, b, path: tuple) -> tuple | None:
    """The first key path where two nested mappings differ, with both values (``_ABSENT`` where
    one lacks the key); None when they are equal."""
    if isinstance(a, dict) and isinstance(b, dict):
        pairs = [(key, a.get(key, _ABSENT), b.get(key, _ABSENT)) for key in [*a, *(key for key in b if key not in a)]]
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        pairs = list(zip(range(len(a)), a, b))
    else:
        return None if a == b else (path, a, b)
    return next((found for key, x, y in pairs if (found := _first_difference(x, y, (*path, key)))), None)


def _finished(run: Run) -> bool:
    """Whether the run has finished as planned: its ``result.json`` beside the planned recipe."""
    return (run.folder / "result.json").exists() and _stored_recipe_is_planned(run) is True


def _same_recipe(stored: dict, planned: dict) -> bool:
    """Whether a run folder's recipe is the planned one: equal once resolved by this seqzoo, so a
    setting that a later version adds with its default does not throw finished runs away."""
    if stored == planned:
        return True
    try:
        return resolve(stored).data == resolve(planned).data
    except SeqzooError:
        return False


def _launch(run: Run, threads: int) -> subprocess.Popen:
    checkpoint = run.folder / "model.safetensors"
    command = [sys.executable, "-m", "seqzoo", "train", str(run.folder / "recipe.yaml"), "-o", str(checkpoint),
               "--log-dir", str(run.folder), "--metrics", str(run.folder / "train.json"), "--quiet",
               "--threads", str(threads)]
    if checkpoint.exists():
        command += ["--resume", str(checkpoint)]
    environment = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    with open(run.folder / "train.log", "a", encoding="utf-8") as handle:
        handle.write(f"$ {' '.join(command)}\n")
        handle.flush()
        return subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=environment)


def _finish(run: Run, stretch: float) -> dict:
    """Summarise a finished run, whose last process took ``stretch`` seconds, into ``result.json``
    (its marker of being done)."""
    metrics = json.loads((run.folder / "train.json").read_text(encoding="utf-8"))
    wall = _add_wall(run, stretch)
    history = metrics["history"]
    speeds = [e["tokens_per_s"] for e in history[1:] or history]
    curve = history  # every logged step: loss, tokens, seconds, held-out results, expert load, ...
    result = {"arm": run.arm, "seed": run.seed, "parameters": run.parameters, "non_embedding": run.non_embedding,
              "flops_per_token": metrics.get("flops_per_token"), "precision": metrics.get("precision"),
              "tokens_per_s": statistics.median(speeds) if speeds else None,
              "peak_memory_mb": max((e.get("peak_memory_mb", 0.0) for e in history), default=None),
              "eval": metrics["eval"], "steps": metrics["steps"], "wall_seconds": round(wall, 1),
              "train_seconds": history[-1].get("seconds") if history else None, "machine": machine(),
              "curve": curve}
    write_text_atomic(run.folder / "result.json", json.dumps(result, indent=1))
    return result


def _add_wall(run: Run, seconds: float) -> float:
    """Add one stretch of the run's process to its ``wall.json`` and return the sum: a run
    interrupted and resumed across sessions (or failed and retried) reports every stretch it took,
    not only the last."""
    wall_file = run.folder / "wall.json"
    total = (json.loads(wall_file.read_text())["seconds"] if wall_file.exists() else 0.0) + seconds
    write_text_atomic(wall_file, json.dumps({"seconds": total}))
    return total


def _result_line(result: dict) -> str:
    e = result["eval"]
    line = f"held-out loss {e['loss']:.4f}"
    if "perplexity" in e:
        line += f" (perplexity {e['perplexity']:.2f})"
    if "accuracy" in e:
        line += f", accuracy {e['accuracy']:.3f}"
    if "exact" in e:
        line += f", exact rows {e['exact']:.3f}"
    return f"{line} in {result['wall_seconds']:.0f} s"


# -- results -------------------------------------------------------------------------------------------
def collect(comparison: Plan, output: str | Path) -> dict:
    """Read every finished run's result and write ``results.json``, ``results.md`` and the figures
    (when matplotlib is installed); unfinished runs, and runs that trained another recipe than the
    planned one, are listed as unfinished."""
    output = Path(output)
    runs, missing = [], []
    for run in comparison.runs:
        if _finished(run):
            runs.append(json.loads((run.folder / "result.json").read_text(encoding="utf-8")))
        else:
            missing.append(run.label)
    results = {"settings": comparison.settings, "machine": machine(), "runs": runs, "unfinished": missing}
    write_text_atomic(output / "results.json", json.dumps(results, indent=1))
    write_text_atomic(output / "results.md", markdown(results) + "\n")
    try:
        results["figures"] = draw(results, output)
    except PlotError as error:  # the table stands without them; the caller says what was skipped
        results["figures"], results["figures_skipped"] = [], str(error)
    return results


def compare(arms: list[Arm], output: str | Path, *, steps: int | None = None, tokens: int | None = None,
            seeds: list[int] = (0,), data: str | None = None, overrides: list[str] = (), match_params: bool = False,
            workers: int = 1, threads: int | None = None, log: Callable[[str], None] = print,
            report_only: bool = False, every_run: bool = False) -> dict:
    """Plan, train (what has not finished; nothing with ``report_only``) and tabulate a comparison;
    see the module docstring and ``execute``."""
    comparison = plan(arms, output, steps=steps, tokens=tokens, seeds=list(seeds), data=data,
                      overrides=list(overrides), match_params=match_params, log=log)
    return execute(comparison, output, workers=workers, threads=threads, log=log, report_only=report_only,
                   every_run=every_run)

