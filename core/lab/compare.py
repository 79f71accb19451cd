"""``seqzoo compare``: train several recipes on the same data, windows and budget, and tabulate them.

Every run — one recipe (an *arm*) at one seed — is planned before anything trains: its recipe is
resolved with the shared overrides, the data, the budget and (``match_params``) an FFN width that
gives it the first arm's parameter count; the arms must share a tokenizer and a task, and the
budget must hold at least one step. Each run then trains in a process of its own (``seqzoo
train``), K at a time, into ``OUT/runs/ARM/seedS/``: its resolved recipe, its checkpoint (saved
along the way), its metrics and its log. A run is finished when its ``result.json`` exists, so an
interrupted comparison, run again with the same command, trains only what did not finish —
resuming a run from its last checkpoint — and then rewrites ``results.json``, ``results.md`` and
the figures from the finished runs' files.

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

import torch
import yaml

from ..errors import SeqzooError
from ..files import write_text_atomic
from ..interfaces import TokenTask
from ..io.build import instantiate
from ..recipe import resolve
from ..registry import registry, tokenizer
from ..train.token_batches import data_override, fit_window
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
            log: Callable[[str], None] = print) -> dict:
    """Train every run that has not finished, ``workers`` at a time, each in its own process with
    ``threads`` CPU threads (default: the cores shared out); then write and return the results."""
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    threads = threads or max(1, (os.cpu_count() or 1) // max(1, workers))
    pending = []
    for run in comparison.runs:
        if _prepare_folder(run, log):
            pending.append(run)
    finished = len(comparison.runs) - len(pending)
    if finished:
        log(f"{finished} of {len(comparison.runs)} run(s) already finished; training the other {len(pending)}")
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
                    failures.append(run)
                    log(f"{run.label}: failed (exit {code}); see {run.folder / 'train.log'}")
                    continue
                result = _finish(run, time.perf_counter() - started)
                log(f"{run.label}: {_result_line(result)}")
    except KeyboardInterrupt:
        for _, process, _ in running:
            try:
                process.wait(timeout=60)  # the child got the same Ctrl-C and saves at a step boundary
            except subprocess.TimeoutExpired:
                process.kill()
        raise
    results = collect(comparison, output)
    if failures:
        raise CompareError(f"{len(failures)} run(s) failed: {', '.join(r.label for r in failures)}; their logs say "
                           f"why ({failures[0].folder / 'train.log'}, ...); run the command again to retry them")
    return results


def _prepare_folder(run: Run, log: Callable[[str], None]) -> bool:
    """Write the run's recipe; True when the run still has to train. A folder whose recipe differs
    from the planned one (another budget, another width) holds a stale run: it starts over."""
    run.folder.mkdir(parents=True, exist_ok=True)
    recipe_file = run.folder / "recipe.yaml"
    if recipe_file.exists():
        if not _same_recipe(yaml.safe_load(recipe_file.read_text(encoding="utf-8")), run.recipe):
            log(f"{run.label}: its recipe changed since the last time; starting it over")
            for name in ("model.safetensors", "result.json", "metrics.jsonl", "train.json", "wall.json"):
                (run.folder / name).unlink(missing_ok=True)
        elif (run.folder / "result.json").exists():
            return False  # finished, and its recipe file stays as it trained
    write_text_atomic(recipe_file, yaml.safe_dump(run.recipe, sort_keys=False))
    return not (run.folder / "result.json").exists()


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


def _finish(run: Run, wall: float) -> dict:
    """Summarise a finished run into ``result.json`` (its marker of being done)."""
    metrics = json.loads((run.folder / "train.json").read_text(encoding="utf-8"))
    wall_file = run.folder / "wall.json"
    earlier = json.loads(wall_file.read_text())["seconds"] if wall_file.exists() else 0.0
    write_text_atomic(wall_file, json.dumps({"seconds": earlier + wall}))
    history = metrics["history"]
    speeds = [e["tokens_per_s"] for e in history[1:] or history]
    curve = history  # every logged step: loss, tokens, seconds, held-out results, expert load, ...
    result = {"arm": run.arm, "seed": run.seed, "parameters": run.parameters, "non_embedding": run.non_embedding,
              "flops_per_token": metrics.get("flops_per_token"), "precision": metrics.get("precision"),
              "tokens_per_s": statistics.median(speeds) if speeds else None,
              "peak_memory_mb": max((e.get("peak_memory_mb", 0.0) for e in history), default=None),
              "eval": metrics["eval"], "steps": metrics["steps"], "wall_seconds": round(earlier + wall, 1),
              "train_seconds": history[-1].get("seconds") if history else None, "machine": machine(),
              "curve": curve}
    write_text_atomic(run.folder / "result.json", json.dumps(result, indent=1))
    return result


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
    (when matplotlib is installed); unfinished runs are listed as such."""
    output = Path(output)
    runs, missing = [], []
    for run in comparison.runs:
        path = run.folder / "result.json"
        if path.exists():
            runs.append(json.loads(path.read_text(encoding="utf-8")))
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


def machine() -> dict:
    """Where the numbers were measured: the CPU model, cores, torch and the accelerator, if any."""
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__, "gpu": gpu}


def summary_rows(results: dict) -> list[dict]:
    """One row per arm: parameters, speed, memory and the held-out metrics over its seeds."""
    by_arm: dict[str, list[dict]] = {}
    for run in results["runs"]:
        by_arm.setdefault(run["arm"], []).append(run)
    rows = []
    for arm, runs in by_arm.items():
        row = {"arm": arm, "seeds": [r["seed"] for r in runs], "parameters": runs[0]["parameters"],
               "non_embedding": runs[0]["non_embedding"], "flops_per_token": runs[0]["flops_per_token"],
               "tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs if r["tokens_per_s"]),
               "peak_memory_mb": max(r["peak_memory_mb"] or 0 for r in runs),
               "wall_seconds": statistics.fmean(r["wall_seconds"] for r in runs)}
        for key in ("loss", "perplexity", "accuracy", "exact"):
            values = [r["eval"][key] for r in runs if key in r["eval"]]
            if values:
                row[key] = values
        rows.append(row)
    return rows


def _mean_sd(values: list[float], digits: int = 4) -> str:
    mean = statistics.fmean(values)
    if len(values) < 2:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def markdown(results: dict) -> str:
    """The comparison as a markdown table (mean ± sd over seeds), with the machine and settings."""
    rows = summary_rows(results)
    settings = results["settings"]
    has = {key: any(key in r for r in rows) for key in ("perplexity", "accuracy", "exact")}
    columns = ["model", "params", "params w/o embeddings", "FLOPs/token", "tokens/s", "peak memory (MB)",
               "held-out loss"]
    columns += ["perplexity"] * has["perplexity"] + ["accuracy"] * has["accuracy"] + ["exact rows"] * has["exact"]
    columns += ["wall time (s)"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        cells = [r["arm"], f"{r['parameters']:,}", f"{r['non_embedding']:,}",
                 f"{r['flops_per_token'] / 1e6:.2f}M" if r["flops_per_token"] else "–",
                 f"{r['tokens_per_s']:,.0f}", f"{r['peak_memory_mb']:.0f}", _mean_sd(r["loss"])]
        if has["perplexity"]:
            cells.append(_mean_sd(r["perplexity"], 2) if "perplexity" in r else "–")
        if has["accuracy"]:
            cells.append(_mean_sd(r["accuracy"], 3) if "accuracy" in r else "–")
        if has["exact"]:
            cells.append(_mean_sd(r["exact"], 3) if "exact" in r else "–")
        cells.append(f"{r['wall_seconds']:.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    budget = f"{settings['steps']:,} steps" if settings.get("steps") else f"{settings['tokens']:,} tokens"
    seeds = ", ".join(map(str, settings["seeds"]))
    notes = [f"Budget: {budget} ({settings['run_steps']:,} steps) per run; seeds {seeds}"
             f"; data: {settings.get('data') or 'the recipes’ task'}"
             + ("; FFN widths matched to the first model's parameter count" if settings.get("match_params") else "")
             + ".",
             _measured_on(results)]
    if results.get("unfinished"):
        notes.append(f"Not finished: {', '.join(results['unfinished'])}.")
    return "\n".join(lines) + "\n\n" + "\n".join(notes)


def _where(m: dict) -> str:
    return f"{m['cpu']} ({m['cores']} cores), torch {m['torch']}" + (f", {m['gpu']}" if m.get("gpu") else "")


def _measured_on(results: dict) -> str:
    """The machine the runs trained on, and in which precision (``train.precision=auto`` picks
    bfloat16 autocast on a CPU fast at it) — each run records its own, since an interrupted
    comparison may be finished on another; several are named with their runs, as their speeds differ."""
    places: dict[str, list[str]] = {}
    for run in results["runs"]:
        precision = (run.get("precision") or {}).get("precision")
        where = _where(run.get("machine") or results["machine"]) + (f", {precision}" if precision else "")
        places.setdefault(where, []).append(f"{run['arm']} seed {run['seed']}")
    if len(places) <= 1:
        return f"Measured on {next(iter(places), _where(results['machine']))}."
    listed = "; ".join(f"{where}: {', '.join(runs)}" for where, runs in places.items())
    return f"Measured on {len(places)} machines, so tokens/s and wall time compare only within one — {listed}."


def curves(results: dict, x: str) -> dict[str, tuple[list[float], list[float]]]:
    """Held-out loss against ``x`` (``tokens`` or ``seconds``) per arm, averaged over seeds at each
    evaluation (the seeds of an arm evaluate at the same steps)."""
    by_arm: dict[str, dict[int, list[tuple[float, float]]]] = {}
    for run in results["runs"]:
        points = by_arm.setdefault(run["arm"], {})
        for entry in run["curve"]:
            if "eval" in entry and entry.get(x) is not None:
                points.setdefault(entry["step"], []).append((entry[x], entry["eval"]["loss"]))
    out = {}
    for arm, points in by_arm.items():
        steps = sorted(points)
        out[arm] = ([statistics.fmean(p[0] for p in points[s]) for s in steps],
                    [statistics.fmean(p[1] for p in points[s]) for s in steps])
    return out


#: The line style of the first ten arms, the next ten, ...
LINE_STYLES = ("-", "--", ":", "-.")


def draw(results: dict, output: Path) -> list[str]:
    """``loss-tokens.png`` and ``loss-seconds.png``: held-out loss per arm (PlotError without
    matplotlib)."""
    from .plots import figure, save_figure

    paths = []
    for x, label in (("tokens", "training tokens"), ("seconds", "training seconds")):
        lines = curves(results, x)
        if not any(xs for xs, _ in lines.values()):
            continue
        fig = figure(6.4, 4.2)
        ax = fig.subplots()
        for index, (arm, (xs, ys)) in enumerate(lines.items()):
            # matplotlib's colour cycle has ten colours: past them, the line style tells arms apart
            ax.plot(xs, ys, marker="o", ms=3, label=arm, color=f"C{index % 10}", ls=LINE_STYLES[index // 10 % 4])
        ax.set(xlabel=label, ylabel="held-out loss", title=f"held-out loss against {label}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2 if len(lines) > 8 else 1)
        paths.append(save_figure(fig, output / f"loss-{x}.png"))
    return paths


def compare(arms: list[Arm], output: str | Path, *, steps: int | None = None, tokens: int | None = None,
            seeds: list[int] = (0,), data: str | None = None, overrides: list[str] = (), match_params: bool = False,
            workers: int = 1, threads: int | None = None, log: Callable[[str], None] = print) -> dict:
    """Plan, train (what has not finished) and tabulate a comparison; see the module docstring."""
    comparison = plan(arms, output, steps=steps, tokens=tokens, seeds=list(seeds), data=data,
                      overrides=list(overrides), match_params=match_params, log=log)
    return execute(comparison, output, workers=workers, threads=threads, log=log)

