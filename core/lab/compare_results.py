"""What a comparison's results say: the table (mean ± sd over seeds) with the machine and the
settings, and the held-out loss curves against tokens and against seconds (``seqzoo.lab.compare``
writes them from the finished runs' files)."""
from __future__ import annotations

import os
import statistics
from pathlib import Path

import torch


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


def wall_seconds(run: dict) -> float:
    """A run's wall time, never less than its training clock: seqzoo before 2026-12-04 kept only a
    resumed run's last stretch in ``wall.json``, so such a run's whole training time is the lower
    bound its result still holds."""
    return max(run["wall_seconds"], run.get("train_seconds") or 0.0)


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
               "wall_seconds": statistics.fmean(wall_seconds(r) for r in runs)}
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
