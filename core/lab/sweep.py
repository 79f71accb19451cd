"""The shared design of the recall and copying studies (``seqzoo experiment recall | copying``):
contenders at equal parameter counts, a learning-rate sweep per contender on the first seed, every
seed at the best rate, and a score per group of held-out rows (N pairs, string length).

Both phases are ``seqzoo compare`` runs in one folder, so an interrupted study continues where it
stopped and the first seed's run at the best rate is not trained twice: a run is named by its
contender and rate, and compare keeps what has finished. The FFN width of every contender is
solved to the first contender's parameter count, which does not depend on the rate, so both phases
resolve to the same recipes.
"""
from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from .compare import Arm, compare


@dataclass(frozen=True)
class Contender:
    """One model of a study: its family (attention, mamba, mamba2, hybrid), the SSM's d_state N
    (None for attention), the overrides of the shared base, and the fewest layers it can have (a
    hybrid with attention in one layer of four needs four)."""

    name: str
    family: str
    state: int | None
    overrides: tuple[str, ...]
    min_layers: int = 1

    @property
    def pure_ssm(self) -> bool:
        return self.family in ("mamba", "mamba2")


def state_floats(contender: Contender, dim: int, expand: int = 2) -> int | None:
    """The recurrent state an SSM layer carries between tokens, in floats: E·N for the E = expand·C
    channels (Mamba) or heads × head dim (Mamba-2) and d_state N; None for attention, whose KV cache
    grows with the sequence. (The causal convolution's window of d_conv − 1 inputs is on top.)"""
    return None if contender.state is None else expand * dim * contender.state


def vocabulary(needed: int) -> int:
    """A vocabulary that holds ``needed`` ids and the recipe's bytes tokenizer's 259 (the task's
    ids are not text, but the model is a text recipe), rounded up to a multiple of 64."""
    return 64 * math.ceil(max(needed, 259) / 64)


def model_base(shape: dict, layers: int, *, max_seq_len: int, vocab_size: int) -> list[str]:
    """The model every contender starts from: tiny-llama at the shape's width, heads and FFN width,
    ``layers`` deep, no RoPE scaling, tied embeddings."""
    return [f"model.dim={shape['dim']}", f"model.layers={layers}", f"model.attention.heads={shape['heads']}",
            "model.attention.kv_heads=null", "model.position.scaling=null", f"model.max_seq_len={max_seq_len}",
            "model.tie_embeddings=true", f"model.ffn.hidden={shape['hidden']}", f"model.vocab_size={vocab_size}"]


def training(shape: dict, task: dict) -> list[str]:
    """The train: section every run shares but the rate: ``task``, AdamW (weight decay 0.1, β2
    0.999), warm-up over 5% then cosine to 0, clip 1, held-out scores ``evals`` times per run."""
    steps = shape["steps"]
    return [f"train.task={json.dumps(task)}", f"train.batch_size={shape['batch']}",
            f"train.warmup={max(1, steps // 20)}", "train.weight_decay=0.1", "train.min_lr_ratio=0.0",
            "train.grad_clip=1.0", "train.beta2=0.999", f"train.eval_examples={shape['eval']}",
            f"train.eval_every={max(1, steps // shape['evals'])}", f"train.log_every={max(1, steps // 100)}"]


#: How the runs train, for the settings of a study's result.
OPTIMIZER = "AdamW, weight decay 0.1, clip 1.0, beta2 0.999, warm-up 5% then cosine to 0"


def run_name(contender: Contender, rate: float) -> str:
    return f"{contender.name} · lr {rate:g}"


def score(run: dict, metric: str) -> dict[str, float]:
    """A finished run's held-out ``metric`` per group (``{"N=4": 0.97, ...}``)."""
    evaluation = run["eval"]
    groups = evaluation.get("groups")
    return {name: group[metric] for name, group in groups.items()} if groups else {"all": evaluation[metric]}


def study(contenders: list[Contender], base: list[str], training: list[str], *, rates: list[float],
          seeds: list[int], steps: int, folder: str, metric: str, log: Callable[[str], None] = print,
          threads: int = 1, workers: int | None = None, report_only: bool = False) -> dict:
    """Sweep ``rates`` for every contender on ``seeds[0]``, then train every seed at each
    contender's best rate (the highest mean ``metric`` over the groups; ties to the lower loss).
    ``report_only``: train nothing, and refuse (CompareError) while a run has not finished.

    Returns {"sweep": {name: {rate: mean score}}, "best": {name: rate}, "runs": {name: [runs of
    every seed at the best rate]}, "parameters": {name: count}}. ``training`` is the shared
    ``train.`` overrides without the rate, which each run adds."""
    workers = workers or max(1, (os.cpu_count() or 1) // threads)

    def arms(choice: dict[str, list[float]]) -> list[Arm]:
        return [Arm(run_name(c, rate), "tiny-llama", (*base, *c.overrides, f"train.lr={rate}"))
                for c in contenders for rate in choice[c.name]]

    common = {"steps": steps, "overrides": training, "match_params": True, "threads": threads,
              "workers": workers, "log": log, "report_only": report_only, "every_run": True}
    swept = compare(arms({c.name: rates for c in contenders}), folder, seeds=seeds[:1], **common)
    sweep, best = best_rates(contenders, rates, {run["arm"]: run for run in swept["runs"]}, metric)
    final = compare(arms({c.name: [best[c.name]] for c in contenders}), folder, seeds=seeds, **common)
    runs: dict[str, list[dict]] = {c.name: [] for c in contenders}
    parameters = {}
    for run in sorted(final["runs"], key=lambda r: r["seed"]):
        name = run["arm"].rsplit(" · lr ", 1)[0]
        runs[name].append(run)
        parameters[name] = run["parameters"]
    # seed 0 at the best rate is in both phases: count it once
    trained = {(run["arm"], run["seed"]): run for run in [*swept["runs"], *final["runs"]]}
    return {"sweep": sweep, "best": best, "runs": runs, "parameters": parameters, "compute": compute(trained.values())}


def compute(runs) -> dict:
    """What the finished ``runs`` cost to train -> {"runs": count, "seconds": sum}: each run's own
    training clock (``train_seconds``, the last point of its curve), which a resumed run carries on
    from its checkpoint. Not the wall time: seqzoo before 2026-12-04 kept only a resumed run's last
    stretch in ``wall.json``, and a stretch counts the work an interruption threw away."""
    runs = list(runs)
    return {"runs": len(runs), "seconds": round(sum(run["train_seconds"] or 0.0 for run in runs), 1)}


def compute_line(*spent: dict) -> str:
    """``compute`` results, summed, in words: "R runs, H hours of training"."""
    runs, seconds = sum(s["runs"] for s in spent), sum(s["seconds"] for s in spent)
    return f"{runs} runs, {seconds / 3600:.1f} hours of training"


def best_rates(contenders: list[Contender], rates: list[float], by_name: dict[str, dict],
               metric: str) -> tuple[dict, dict]:
    """The sweep's reading -> ({name: {rate: mean score over the groups}}, {name: best rate}): the
    highest mean ``metric``, ties to the lower held-out loss. ``by_name``: the first seed's finished
    runs by arm name."""
    sweep, best = {}, {}
    for c in contenders:
        sweep[c.name] = {rate: statistics.fmean(score(by_name[run_name(c, rate)], metric).values()) for rate in rates}
        best[c.name] = max(rates, key=lambda rate: (sweep[c.name][rate], -by_name[run_name(c, rate)]["eval"]["loss"]))
    return sweep, best


def per_group(runs: list[dict], metric: str) -> dict[str, list[float]]:
    """{group: [each seed's value]} over a contender's runs."""
    table: dict[str, list[float]] = {}
    for run in runs:
        for group, value in score(run, metric).items():
            table.setdefault(group, []).append(value)
    return table


def first_below(curve: list[float], xs: list[int], threshold: float) -> float:
    """The first x at which the curve drops below ``threshold``; infinity when it never does."""
    return next((x for x, y in zip(xs, curve) if y < threshold), float("inf"))


#: The pre-registered thresholds (docs/experiments.md states them before any result).
SOLVED, GAP, CLOSE, HOLDS = 0.99, 0.2, 0.05, 0.9


def falls(curve: list[float]) -> bool:
    """Whether a curve falls with x: its last value more than CLOSE below its first, and no step up
    larger than CLOSE (seed noise) on the way."""
    return curve[-1] < curve[0] - CLOSE and all(b <= a + CLOSE for a, b in zip(curve, curve[1:]))


def invalid(reference_seeds: list[list[float]], xs: list[int], *, reference: str,
            checked: list[int] | None = None) -> str | None:
    """The validity rule: why the table does not count (the reference below SOLVED at a checked x,
    default every x, in some seed), or None when it does."""
    failed = [(seed, x, run[xs.index(x)]) for seed, run in enumerate(reference_seeds)
              for x in (xs if checked is None else checked) if run[xs.index(x)] < SOLVED]
    if not failed:
        return None
    seed, x, value = failed[0]
    return (f"{reference} reaches {value:.3f} < {SOLVED} at {x} in seed #{seed}: raise the budget; "
            f"no comparison is reported")


def verdict(contenders: list[Contender], means: dict[str, list[float]], reference_seeds: list[list[float]],
            xs: list[int], *, reference: str, checked: list[int] | None = None) -> tuple[str, list[str]]:
    """Apply the pre-registered criteria to one table -> (verdict, the reasons, one line each).

    ``means[name]``: a contender's mean score at each x (N or length, ascending); ``reference_seeds``:
    the reference's (attention's) score at each x, per seed; ``checked``: the x at which the
    reference must be solved for the table to count (default: every x).
    - invalid: the reference is below SOLVED at a checked x in some seed;
    - not supported: a pure SSM at its family's smallest state stays within CLOSE of the reference
      at every x;
    - supported: every pure SSM falls with x and ends at least GAP below the reference at the
      largest x; within each family, the first x below HOLDS does not shrink as the state grows
      and is larger at the largest state than at the smallest; and every hybrid stays within
      CLOSE of the reference at every x;
    - inconclusive: anything else.
    """
    unsolved = invalid(reference_seeds, xs, reference=reference, checked=checked)
    if unsolved:
        return "invalid", [unsolved]
    ref = means[reference]
    ssms = [c for c in contenders if c.pure_ssm]
    families = {c.family: sorted((s for s in ssms if s.family == c.family), key=lambda s: s.state) for c in ssms}
    for family, members in families.items():
        smallest = members[0]
        if all(abs(a - b) <= CLOSE for a, b in zip(means[smallest.name], ref)):
            return "not supported", [f"{smallest.name} (the smallest {family} state) stays within {CLOSE} of "
                                     f"{reference} at every x"]
    reasons, ok = [], True
    for c in ssms:
        gap = ref[-1] - means[c.name][-1]
        good = falls(means[c.name]) and gap >= GAP
        ok &= good
        reasons.append(f"{c.name}: {'falls' if falls(means[c.name]) else 'does not fall'} with x; "
                       f"{gap:+.3f} below {reference} at x = {xs[-1]} ({'≥' if gap >= GAP else '<'} {GAP})")
    for family, members in families.items():
        if len(members) < 2:
            continue
        onsets = [first_below(means[m.name], xs, HOLDS) for m in members]
        grows = all(b >= a for a, b in zip(onsets, onsets[1:])) and onsets[-1] > onsets[0]
        ok &= grows
        reasons.append(f"{family}: first x below {HOLDS} by state " + ", ".join(
            f"N={m.state}: {'never' if o == float('inf') else o}" for m, o in zip(members, onsets))
                       + (" (grows)" if grows else " (does not grow)"))
    for c in contenders:
        if c.family == "hybrid":
            worst = max(abs(a - b) for a, b in zip(means[c.name], ref))
            ok &= worst <= CLOSE
            reasons.append(f"{c.name}: at most {worst:.3f} from {reference} ({'≤' if worst <= CLOSE else '>'} {CLOSE})")
    return ("supported" if ok else "inconclusive"), reasons


def trainability(contenders: list[Contender], means: dict[str, list[float]], xs: list[int]) -> list[str]:
    """The trainability control's reading, stated before its results: one line per mimetic
    contender, against the default model of its family and state (a control without one has no
    reading).
    - "trainability": at some x the default is below HOLDS and the mimetic start at least GAP above
      it; there the default's shortfall is a matter of training at this budget, not of its state;
    - either way, the first x at which the mimetic start itself drops below HOLDS, if any: the limit
      that a better start does not lift at this budget;
    - "no change": neither; the default's curve stands as the verdict reads it."""
    lines = []
    for control in (c for c in contenders if c.family.endswith(" mimetic")):
        default = next((c.name for c in contenders if c.family == control.family.removesuffix(" mimetic")
                        and c.state == control.state), None)
        if default is None:
            continue
        ahead = [x for x, d, m in zip(xs, means[default], means[control.name]) if d < HOLDS and m >= d + GAP]
        onset = first_below(means[control.name], xs, HOLDS)
        limit = "never drops" if onset == float("inf") else f"first drops at x = {onset}"
        reading = f"trainability at x = {', '.join(map(str, ahead))}" if ahead else "no change"
        lines.append(f"{control.name} against {default}: {reading}; the mimetic start {limit} below {HOLDS}")
    return lines


def state_space_contenders(states: dict[str, list[int]], hybrid: bool,
                           mimetic: dict[str, list[int]] | None = None) -> list[Contender]:
    """Mamba and Mamba-2 (expand 2; Mamba-2 heads of 16) at each d_state of ``states``, without
    position scheme; after each family its trainability controls, the same model at each d_state
    of ``mimetic`` started as linear attention (``mimetic: true``, Trockman et al., 2024; family
    "<family> mimetic", outside the verdict); and optionally the hybrid: Mamba-2 (N = 16) with
    attention in every fourth layer."""
    shape = {"mamba": "expand: 2", "mamba2": "head_dim: 16, expand: 2"}
    found = []
    for family in ("mamba", "mamba2"):
        for state, start in [*((s, "") for s in states.get(family, [])),
                             *((s, " mimetic") for s in (mimetic or {}).get(family, []))]:
            mixer = f"{{kind: {family}, state: {state}, {shape[family]}{', mimetic: true' if start else ''}}}"
            found.append(Contender(f"{family} N={state}{start}", family + start, state,
                                   (f"model.mixer={mixer}", "model.position=none")))
    if hybrid:
        found.append(Contender("hybrid 1:4", "hybrid", 16,
                               ("model.mixer={kind: mamba2, state: 16, head_dim: 16, expand: 2}",
                                "model.layer_types={ssm: {}, attention: {mixer: attention}}",
                                "model.pattern=[ssm, ssm, ssm, attention]"), min_layers=4))
    return found


def line_style(family: str) -> str:
    """How a study's figures draw a family: attention and the hybrid dashed, the mimetic controls
    dotted, the pure state-space models solid."""
    return "--" if family in ("attention", "hybrid") else ":" if family.endswith(" mimetic") else "-"


def tabulate(who: list[Contender], found: dict, groups: list[str], metric: str, xs: list[int], *, dim: int,
             reference: str, checked: list[int] | None = None) -> tuple[dict, list[list]]:
    """One depth of a study -> (its data: means, every seed's value, the sweep, the best rates,
    each contender's family and state, the verdict and its reasons; its table rows: model, state
    floats per layer, parameters, best rate, mean ± sd per group, every seed at the last group)."""
    table = {c.name: per_group(found["runs"][c.name], metric) for c in who}
    means = {name: [statistics.fmean(values[g]) for g in groups] for name, values in table.items()}
    by_seed = [list(values) for values in zip(*[table[reference][g] for g in groups])]  # seed -> per group
    outcome, reasons = verdict(who, means, by_seed, xs, reference=reference, checked=checked)
    if outcome != "invalid":  # an invalid table reports no comparison, the control's included
        reasons += trainability(who, means, xs)  # the control, beside the verdict and outside it
    rows = []
    for c in who:
        spread = [statistics.pstdev(table[c.name][g]) for g in groups]
        rows.append([c.name, state_floats(c, dim) or "KV cache", found["parameters"][c.name],
                     f"{found['best'][c.name]:g}",
                     *[f"{m:.3f} ± {s:.3f}" for m, s in zip(means[c.name], spread)],
                     " / ".join(f"{v:.2f}" for v in table[c.name][groups[-1]])])
    data = {"means": means, "per_seed": table,
            "sweep": {name: {f"{rate:g}": value for rate, value in rates.items()}
                      for name, rates in found["sweep"].items()},
            "best": found["best"], "family": {c.name: c.family for c in who}, "state": {c.name: c.state for c in who},
            "verdict": outcome, "reasons": reasons}
    return data, rows


def overall_verdict(verdicts: list[str]) -> str:
    """The pre-registered rule across depths: invalid if any depth is, supported only if every depth
    supports the claim, not supported if any depth does not, inconclusive otherwise."""
    if "invalid" in verdicts:
        return "invalid"
    if all(v == "supported" for v in verdicts):
        return "supported"
    return "not supported" if "not supported" in verdicts else "inconclusive"


@dataclass
class Depths:
    """A study run at every depth of its shape: the table rows (depth first), each depth's data (as
    ``tabulate`` gives it) and its ``study`` result, and the verdict across depths."""

    rows: list[list]
    data: dict[str, dict]
    found: dict[str, dict]
    verdict: str

    def notes(self) -> list[str]:
        spent = {layers: found["compute"] for layers, found in self.found.items()}
        return [*(f"{layers} layers: {d['verdict']} — " + "; ".join(d["reasons"]) for layers, d in self.data.items()),
                f"compute: {compute_line(*spent.values())} ("
                + ", ".join(f"{layers} layers: {compute_line(s)}" for layers, s in spent.items()) + ")"]


def every_depth(shape: dict, folder: str, contenders: Callable[[int], list[Contender]],
                base: Callable[[int], list[str]], train: list[str], *, groups: list[str], xs: list[int],
                metric: str, reference: str, checked: list[int] | None = None,
                log: Callable[[str], None] = print, threads: int = 1, workers: int | None = None,
                report_only: bool = False) -> Depths:
    """``study`` then ``tabulate`` at each of the shape's depths, runs kept in ``folder``/layersL."""
    rows, data, found = [], {}, {}
    for layers in shape["layers"]:
        who = contenders(layers)
        found[str(layers)] = study(who, base(layers), train, rates=shape["rates"], seeds=shape["seeds"],
                                   steps=shape["steps"], folder=os.path.join(folder, f"layers{layers}"),
                                   metric=metric, log=log, threads=threads, workers=workers,
                                   report_only=report_only)
        data[str(layers)], depth_rows = tabulate(who, found[str(layers)], groups, metric, xs, dim=shape["dim"],
                                                 reference=reference, checked=checked)
        rows += [[layers, *row] for row in depth_rows]
    return Depths(rows, data, found, overall_verdict([d["verdict"] for d in data.values()]))
