"""Small, seeded experiments that test classic claims on the zoo's own components
(``seqzoo experiment NAME``; results in docs/experiments.md).

- ``extrapolation``: tiny decoders with learned, sinusoidal, ALiBi, RoPE and RoPE+YaRN positions
  trained to copy strings of length <= L, scored by greedy exact match and per-character accuracy
  at L, 2L and 4L (Press et al., 2022 claim ALiBi extrapolates and sinusoidal/RoPE do not).
- ``seq2seq-attention``: recurrent Seq2Seq without attention, with Bahdanau (additive) and with
  Luong (bilinear) attention, trained to reverse strings, scored per source-length bucket
  (Bahdanau et al., 2015 claim attention keeps long inputs accurate).
- ``vanishing-gradients``: ‖∂L/∂h_t‖ against the distance T−1−t for rnn, lstm and gru cells at
  their random initialisation, plus an LSTM with forget-gate bias +1 (Bengio et al., 1994;
  Hochreiter & Schmidhuber, 1997; Gers et al., 2000).
- ``linear-time`` (``seqzoo.lab.linear_time``): training-step time and memory against sequence
  length, and decode time per token, for attention, Mamba, Mamba-2 and linear attention.
- ``recall`` (``seqzoo.lab.recall``): multi-query associative recall (Zoology's layout) against the
  number of pairs, for attention, Mamba and Mamba-2 at several state sizes and a 1-in-4 hybrid,
  with a rate sweep, three seeds and pre-registered criteria (Arora et al., 2023).
- ``copying`` (``seqzoo.lab.copying``): exact copies of random strings against their length, in
  and past the training range, for attention with RoPE and with hard ALiBi, the same state-space
  models and the hybrid (Jelassi et al., 2024).
- ``moe`` (``seqzoo.lab.moe``): a dense FFN against mixtures of experts with the same active
  parameters, and the experts' load with and without balancing.
- ``surgery`` (``seqzoo.lab.surgery``): edits of SmolLM2-135M (YaRN, fewer K/V heads healed by
  LoRA and by full fine-tuning, upcycling), measured by perplexity on pydoc text.

Each writes ``NAME.md`` (a markdown table), ``NAME.json`` and ``NAME.png`` into the output folder.
The text-task experiments train through ``seqzoo.train.training.train`` and score through
``Examples``' greedy decoding; ``recall`` (the ``mqar`` task), ``copying`` (the ``copying`` task)
and ``moe`` are ``seqzoo compare`` runs (``seqzoo.lab.compare``), kept in the output folder so an
interrupted one continues. Every seed is fixed; ``quick`` runs a tiny version in seconds (for
tests). Runs use one CPU
thread by default: these models are so small that extra threads mostly add synchronisation, and
on shared cores they make a run several times slower.
"""
from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch

from ..config import TrainConfig
from ..errors import InputError, unknown_name
from ..files import write_text_atomic
from ..io.build import build
from ..registry import registry, tokenizer
from ..train.examples import Examples, example_rng
from ..train.training import train
from . import copying, delta, linear_time, moe, recall, surgery
from .plots import figure, require_matplotlib, save_figure
from .result import ExperimentResult


def _build(recipe: str, overrides: list[str], seed: int):
    torch.manual_seed(seed)
    model = build(recipe, overrides, device="cpu", dtype="float32")
    return model, tokenizer(model)


def _greedy(model, tokenizer, task, n: int, seed: int, tag: str) -> tuple[list[tuple[str, str]], list[str]]:
    """``n`` held-out (prompt, answer) pairs of ``task`` and the model's greedy answers, decoded
    as ``Examples.evaluate`` decodes them."""
    rng = example_rng(seed, tag)
    pairs = [task.example(rng, "eval") for _ in range(n)]
    examples = Examples(model, tokenizer, task)
    model.eval()
    predictions = examples.answers(model, [p for p, _ in pairs], [a for _, a in pairs], torch.device("cpu"))
    return pairs, predictions


def _scores(pairs: list[tuple[str, str]], predictions: list[str]) -> tuple[float, float]:
    """(exact match, per-character accuracy): character i of the answer counts as right when the
    prediction has the same character at i."""
    exact = sum(p == a for (_, a), p in zip(pairs, predictions)) / len(pairs)
    right = sum(sum(x == y for x, y in zip(a, p)) for (_, a), p in zip(pairs, predictions))
    return exact, right / sum(len(a) for _, a in pairs)


def _samples(pairs: list[tuple[str, str]], predictions: list[str], n: int = 3) -> list[dict[str, str]]:
    """The first ``n`` examples as {prompt, answer, prediction}, so the JSON shows how runs fail."""
    return [{"prompt": p, "answer": a, "prediction": pred} for (p, a), pred in zip(pairs[:n], predictions)]


# -- extrapolation ---------------------------------------------------------------------------------
def extrapolation(quick: bool = False, log: Callable[[str], None] = print) -> ExperimentResult:
    """Train one tiny decoder per position scheme on copy with lengths 1..L; score at L, 2L, 4L."""
    length = 4 if quick else 8
    lengths = [length, 2 * length, 4 * length]
    longest = 2 * (4 * length + 1)  # a 4L prompt with its separator, then the 4L answer and eos
    max_seq_len = longest + 14  # the margin; every scheme gets the same table size
    trained_context = 2 * length + 2  # the longest training sequence: L, '=', L, eos
    yarn = {"kind": "rope", "scaling": {"kind": "yarn", "factor": 4.0, "original_max_seq_len": trained_context}}
    schemes = {"learned": "learned", "sinusoidal": "sinusoidal", "alibi": "alibi",
               "rope": {"kind": "rope"}, "rope+yarn": yarn}
    size = ["model.dim=32", "model.layers=1", "model.ffn.hidden=64"] if quick else []
    config = TrainConfig(task={"kind": "copy", "min_len": 1, "max_len": length},
                         steps=30 if quick else 1500, batch_size=32, lr=1e-3, warmup=5 if quick else 100,
                         eval_examples=16 if quick else 100, log_every=10 if quick else 100, seed=0)
    n_eval = 16 if quick else 200
    rows, data = [], {"lengths": lengths, "exact": {}, "per_char": {}, "train_seconds": {},
                      "heldout_1_to_L": {}, "samples": {}}
    models = {}

    def score(label: str, model, tokenizer) -> None:
        exact_row, char_row = [], []
        for n in lengths:
            task = registry().create("task", {"kind": "copy", "min_len": 1, "max_len": length,
                                              "eval_min_len": n, "eval_max_len": n})
            pairs, predictions = _greedy(model, tokenizer, task, n_eval, config.seed, f"extrapolation-{n}")
            data["samples"].setdefault(label, {})[n] = _samples(pairs, predictions)
            exact, per_char = _scores(pairs, predictions)
            exact_row.append(exact)
            char_row.append(per_char)
        data["exact"][label], data["per_char"][label] = exact_row, char_row
        rows.append([label, *exact_row, *char_row])
        log(f"  {label:<26} exact {' '.join(f'{v:.3f}' for v in exact_row)}   "
            f"per-char {' '.join(f'{v:.3f}' for v in char_row)}")

    for label, position in schemes.items():
        overrides = [*size, f"model.max_seq_len={max_seq_len}", f"model.position={json.dumps(position)}"]
        model, tokenizer = _build("tiny-gpt", overrides, config.seed)
        began = time.perf_counter()
        result = train(model, config, tokenizer, quiet=True)
        data["train_seconds"][label] = round(time.perf_counter() - began, 1)
        data["heldout_1_to_L"][label] = {"loss": result.eval["loss"], "accuracy": result.eval["accuracy"]}
        log(f"{label}: trained {config.steps} steps in {data['train_seconds'][label]} s, held-out "
            f"(lengths 1..{length}) loss {result.eval['loss']:.4f}, exact match {result.eval['accuracy']:.3f}")
        models[label] = (model, tokenizer)
        score(label, model, tokenizer)
    # YaRN as it is meant to be used: switched on, without training, in the model trained with
    # plain RoPE (same weights; only the rotation frequencies and the logit temperature change).
    rope_model, tokenizer = models["rope"]
    overrides = [*size, f"model.max_seq_len={max_seq_len}", f"model.position={json.dumps(yarn)}"]
    swapped, _ = _build("tiny-gpt", overrides, config.seed)
    swapped.load_state_dict(rope_model.state_dict())
    score("rope, yarn added at eval", swapped, tokenizer)
    columns = ["position", *[f"exact @{n}" for n in lengths], *[f"per-char @{n}" for n in lengths]]
    settings = {"recipe": "tiny-gpt", "overrides": size, "max_seq_len": max_seq_len, "L": length,
                "eval_examples_per_length": n_eval, "yarn": yarn["scaling"], "train": asdict(config)}
    return ExperimentResult("extrapolation", f"Copy task, trained on lengths 1..{length}: greedy accuracy "
                            f"at {', '.join(map(str, lengths))}", columns, rows, settings, data)


# -- seq2seq attention -----------------------------------------------------------------------------
def seq2seq_attention(quick: bool = False, log: Callable[[str], None] = print) -> ExperimentResult:
    """rnn_seq2seq with attention none / additive / bilinear on reverse; exact match per bucket."""
    longest, width = (8, 4) if quick else (12, 3)
    beyond = 0 if quick else 4  # one bucket longer than anything trained on
    buckets = [(lo, lo + width - 1) for lo in range(1, longest + 1, width)]
    if beyond:
        buckets.append((longest + 1, longest + beyond))
    variants = {"none (Sutskever)": "none", "additive (Bahdanau)": "additive", "bilinear (Luong)": "bilinear"}
    # init_std 0.1, not the recipe's 0.02: with 0.02 embeddings the inputs barely move the GRU
    # and even the attention models sit on a loss plateau for thousands of steps.
    size = ["model.dim=16", "model.hidden=24"] if quick else ["model.dim=32", "model.hidden=64"]
    size.append("model.init_std=0.1")
    config = TrainConfig(task={"kind": "reverse", "min_len": 1, "max_len": longest},
                         steps=30 if quick else 3000, batch_size=32, lr=3e-3, warmup=5 if quick else 100,
                         eval_examples=16 if quick else 100, log_every=10 if quick else 100, seed=0)
    n_eval = 8 if quick else 100
    rows, data = [], {"buckets": [f"{lo}-{hi}" for lo, hi in buckets], "unseen": int(bool(beyond)),
                      "exact": {}, "per_char": {}, "train_seconds": {}, "heldout_1_to_L": {},
                      "samples": {}}
    for label, attention in variants.items():
        model, tokenizer = _build("tiny-seq2seq", [*size, f"model.attention={attention}"], config.seed)
        began = time.perf_counter()
        result = train(model, config, tokenizer, quiet=True)
        data["train_seconds"][label] = round(time.perf_counter() - began, 1)
        data["heldout_1_to_L"][label] = {"loss": result.eval["loss"], "accuracy": result.eval["accuracy"]}
        log(f"{label}: trained {config.steps} steps in {data['train_seconds'][label]} s, held-out "
            f"(lengths 1..{longest}) loss {result.eval['loss']:.4f}, exact match {result.eval['accuracy']:.3f}")
        exact_row, char_row = [], []
        for lo, hi in buckets:
            task = registry().create("task", {"kind": "reverse", "min_len": 1, "max_len": longest,
                                              "eval_min_len": lo, "eval_max_len": hi})
            pairs, predictions = _greedy(model, tokenizer, task, n_eval, config.seed, f"seq2seq-{lo}-{hi}")
            data["samples"].setdefault(label, {})[f"{lo}-{hi}"] = _samples(pairs, predictions)
            exact, per_char = _scores(pairs, predictions)
            exact_row.append(exact)
            char_row.append(per_char)
        data["exact"][label], data["per_char"][label] = exact_row, char_row
        rows += [[label, "exact match", *exact_row], [label, "per-char", *char_row]]
        log(f"  exact per bucket {' '.join(f'{v:.3f}' for v in exact_row)}   "
            f"per-char {' '.join(f'{v:.3f}' for v in char_row)}")
    columns = ["attention", "metric", *[f"len {b}" + (" (unseen)" if beyond and i == len(buckets) - 1 else "")
                                        for i, b in enumerate(data["buckets"])]]
    settings = {"recipe": "tiny-seq2seq", "overrides": size, "train_lengths": [1, longest],
                "eval_examples_per_bucket": n_eval, "train": asdict(config)}
    return ExperimentResult("seq2seq-attention", f"Reverse task, trained on lengths 1..{longest}: greedy "
                            f"exact match and per-character accuracy per source length", columns, rows, settings, data)


# -- vanishing gradients ---------------------------------------------------------------------------
def gradient_by_distance(cell: torch.nn.Module, steps: int, batch: int,
                         generator: torch.Generator) -> torch.Tensor:
    """‖∂L/∂h_t‖ for t = T−1 .. 0 (index = distance T−1−t), averaged over the batch, with
    L = Σ_b u·h_T for a random unit vector u and inputs x_t ~ N(0, 1). ``cell.step`` runs the
    time loop so every h_t is a tensor whose gradient can be kept. Run it in float64: a vanilla
    RNN's norm falls below float32's smallest number within ~150 steps."""
    dtype = next(cell.parameters()).dtype
    x = torch.randn(batch, steps, cell.input_size, generator=generator, dtype=torch.float64).to(dtype)
    u = torch.randn(cell.hidden_size, generator=generator, dtype=torch.float64)
    u = torch.nn.functional.normalize(u, dim=0).to(dtype)
    state = cell.initial_state(batch)
    outputs = []
    for t in range(steps):
        h, state = cell.step(x[:, t], state)
        h.retain_grad()
        outputs.append(h)
    (outputs[-1] @ u).sum().backward()
    norms = torch.stack([h.grad.norm(dim=-1).mean() for h in outputs])  # (T,)
    return norms.flip(0)  # distance 0 first


def vanishing_gradients(quick: bool = False, log: Callable[[str], None] = print) -> ExperimentResult:
    """Gradient norm against distance for rnn, lstm and gru at torch's default initialisation
    (and an LSTM whose forget-gate bias starts at +1)."""
    steps, hidden, inputs, batch, seeds = (20, 16, 8, 4, 2) if quick else (200, 128, 32, 32, 5)
    distances = [d for d in (0, 1, 5, 10, 20, 50, 100, 199) if d < steps]
    rows, data = [], {"distance": list(range(steps)), "norm": {}}
    # torch initialises the LSTM's forget-gate bias like every other bias (f ≈ σ(0) = 1/2); the
    # extra row adds 1 to it, as Gers et al. (2000) and Jozefowicz et al. (2015) recommend.
    for name, kind, forget_bias in (("rnn", "rnn", 0.0), ("lstm", "lstm", 0.0),
                                    ("lstm, forget bias +1", "lstm", 1.0), ("gru", "gru", 0.0)):
        runs = []
        for seed in range(seeds):
            torch.manual_seed(seed)
            cell = registry().create("cell", kind, inputs, hidden).double()
            if forget_bias:
                with torch.no_grad():
                    cell.bias_ih[hidden:2 * hidden] += forget_bias  # gates i, f, g, o
            runs.append(gradient_by_distance(cell, steps, batch, torch.Generator().manual_seed(1000 + seed)))
        # A geometric mean over seeds: the norms span many orders of magnitude.
        norm = torch.stack(runs).clamp(min=1e-300).log().mean(0).exp()
        data["norm"][name] = norm.tolist()
        far = max(d for d in distances if d > 0)
        per_step = math.exp((math.log(norm[far]) - math.log(norm[1])) / (far - 1)) if far > 1 else float("nan")
        rows.append([name, *[float(norm[d]) for d in distances], per_step])
        log(f"{name}: ‖∂L/∂h‖ at distance {distances}: {' '.join(f'{float(norm[d]):.3g}' for d in distances)}; "
            f"×{per_step:.3f} per step")
    columns = ["cell", *[f"d={d}" for d in distances], "factor per step"]
    settings = {"steps": steps, "hidden": hidden, "input_size": inputs, "batch": batch, "seeds": seeds,
                "init": "torch default U(−1/√H, 1/√H)", "loss": "Σ_b u·h_T, u a random unit vector",
                "inputs": "x_t ~ N(0, 1)"}
    return ExperimentResult("vanishing-gradients", f"‖∂L/∂h_t‖ against distance T−1−t (T={steps}, H={hidden}, "
                            f"random init, geometric mean of {seeds} seeds)", columns, rows, settings, data)


# -- the registry of experiments, outputs ------------------------------------------------------------
EXPERIMENTS: dict[str, Callable[..., ExperimentResult]] = {
    "extrapolation": extrapolation,
    "seq2seq-attention": seq2seq_attention,
    "vanishing-gradients": vanishing_gradients,
    "linear-time": linear_time.linear_time,
    "recall": recall.recall,
    "copying": copying.copying,
    "delta-rule": delta.delta_rule,
    "moe": moe.moe,
    "surgery": surgery.surgery,
}
#: Experiments that train through ``seqzoo compare``: their runs stay in the output folder, so an
#: interrupted one continues where it stopped.
KEEPS_RUNS = ("recall", "copying", "delta-rule", "moe")
#: Experiments that draw their own picture: name -> (draw(result, fig), (width, height) in inches).
DRAWERS: dict[str, tuple[Callable, tuple[float, float]]] = {
    "linear-time": (linear_time.draw, (10.5, 4.0)),
    "recall": (recall.draw, (10.0, 4.0)),  # resized to its panels
    "copying": (copying.draw, (10.0, 4.0)),
    "delta-rule": (delta.draw, (10.0, 4.0)),
    "moe": (moe.draw, (10.0, 4.0)),
    "surgery": (surgery.draw, (10.0, 4.0)),
}


def draw(result: ExperimentResult, path: str | os.PathLike) -> str:
    """The experiment's picture (matplotlib, lazily imported) into ``path``."""
    data = result.data
    if result.name in DRAWERS:
        drawer, size = DRAWERS[result.name]
        fig = figure(*size)
        drawer(result, fig)
    elif result.name == "vanishing-gradients":
        fig = figure(6.4, 4.2)
        ax = fig.subplots()
        for name, norm in data["norm"].items():
            ax.semilogy(data["distance"], norm, label=name)
        ax.set(xlabel="distance T−1−t (steps back from the loss)", ylabel="‖∂L/∂h_t‖ (log scale)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    else:
        if result.name == "extrapolation":
            n = data["lengths"]
            ticks = [f"L = {n[0]}\n(trained)", f"2L = {n[1]}", f"4L = {n[2]}"]
            xlabel = "string length"
        else:
            ticks = [b + ("\n(unseen)" if i >= len(data["buckets"]) - data.get("unseen", 0) else "")
                     for i, b in enumerate(data["buckets"])]
            xlabel = "source length"
        x = list(range(len(ticks)))
        fig = figure(10.0, 4.0)
        axes = fig.subplots(1, 2)
        for ax, metric, label in zip(axes, ("exact", "per_char"), ("exact match", "per-character accuracy")):
            for name, values in data[metric].items():
                ax.plot(x, values, marker="o", label=name, ms=4, ls="--" if "at eval" in name else "-")
            ax.set(ylabel=label, xlabel=xlabel, ylim=(-0.02, 1.02))
            ax.set_xticks(x, ticks, fontsize=8)
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=7)
    fig.suptitle(result.title, fontsize=9)
    return save_figure(fig, path)


def check_names(names: list[str], report_only: bool = False) -> None:
    """Refuse an unknown experiment, or ``report_only`` of one that keeps no runs, before any runs."""
    for name in names:
        if name not in EXPERIMENTS:
            raise InputError(unknown_name("experiment", name, EXPERIMENTS))
        if report_only and name not in KEEPS_RUNS:
            raise InputError(f"--report-only: the {name} experiment keeps no runs to report from; only "
                             f"{', '.join(KEEPS_RUNS)} do (run it without --report-only)")


def run_experiment(name: str, output: str | os.PathLike | None = None, *, quick: bool = False,
                   threads: int | None = 1, log: Callable[[str], None] = print, workers: int | None = None,
                   report_only: bool = False) -> tuple[ExperimentResult, dict[str, str]]:
    """Run experiment ``name`` and write ``NAME.md``, ``NAME.json`` and ``NAME.png`` into
    ``output`` (default ``experiments/NAME``) -> (result, {"md", "json", "png": path}).
    ``workers``: runs trained at once by the experiments that train through compare (default:
    as many as the cores hold at ``threads`` each). ``report_only``: those experiments train
    nothing and rebuild their table and figure from the finished runs in ``output``."""
    check_names([name], report_only)
    if threads is not None and threads < 1:
        raise InputError(f"threads={threads} must be >= 1")
    require_matplotlib()  # fail before training, not after
    folder = os.fspath(output) if output is not None else os.path.join("experiments", name)
    if report_only and not any(Path(folder).glob("**/runs/*/seed*/result.json")):  # before planning any run
        raise InputError(f"{folder}: no finished runs to report; give the folder the runs trained into as -o, or "
                         f"train them: the same command without --report-only")
    os.makedirs(folder, exist_ok=True)
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    began = time.perf_counter()
    try:
        # The experiments that train through `seqzoo compare` keep their runs in the folder.
        kept = {"folder": folder, "workers": workers, "report_only": report_only} if name in KEEPS_RUNS else {}
        result = EXPERIMENTS[name](quick=quick, log=log, **kept)
    finally:
        torch.set_num_threads(previous)
    result.seconds = round(time.perf_counter() - began, 1)
    result.settings.update({"quick": quick, "threads": threads, "torch": torch.__version__, "report_only": report_only})
    paths = {ext: os.path.join(folder, f"{name}.{ext}") for ext in ("md", "json", "png")}
    took = (f"Rebuilt from the finished runs in {result.seconds} s, nothing trained" if report_only else
            f"Run time: {result.seconds} s")
    write_text_atomic(Path(paths["md"]), f"# {name}\n\n{result.title}\n\n{result.markdown()}\n\n"
                      f"{took} ({'quick' if quick else 'full'}, {threads} thread(s)).\n")
    write_text_atomic(Path(paths["json"]), json.dumps(asdict(result), indent=1, default=str))
    draw(result, paths["png"])
    return result, paths
