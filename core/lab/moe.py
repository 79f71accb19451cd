"""``seqzoo experiment moe``: does a mixture of experts learn faster than a dense model with the same
active parameters, and do its experts share the work?

A dense decoder (SwiGLU of width F) is trained beside mixtures of 8 SwiGLU experts of width F / 2
with 2 chosen per token — the same FFN parameters per token, four times as many in all — on the
``sort`` task, all from the same seed, data and schedule:

- ``moe + balance loss``: softmax top-2 with the Switch balancing loss (coefficient 0.01);
- ``moe, no balancing``: the same router with no balancing at all;
- ``moe + bias balancing``: DeepSeek-V3's sigmoid router with its selection-only bias nudged
  after every step (γ = 0.001, ``bias_update``) and no auxiliary loss.

The table gives the loss at a few steps and the held-out exact match; the expert load is logged by
``seqzoo train`` (``expert_load`` per layer) and summarised as the busiest expert's share of the
assignments times E (1 = perfectly even, E = one expert takes everything).
"""
from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable

import torch

from .compare import Arm, compare
from .result import ExperimentResult

FULL = {"dim": 64, "layers": 2, "hidden": 256, "experts": 8, "steps": 1200, "log_every": 20,
        "task": {"kind": "sort", "min_len": 2, "max_len": 10}}
QUICK = {"dim": 32, "layers": 2, "hidden": 32, "experts": 4, "steps": 6, "log_every": 2,
         "task": {"kind": "sort", "min_len": 2, "max_len": 4}}


def variants(shape: dict) -> dict[str, list[str]]:
    """The models' ffn overrides: the dense FFN and three mixtures with half-width experts."""
    expert = {"kind": "swiglu", "hidden": shape["hidden"] // 2}
    moe = {"kind": "moe", "experts": shape["experts"], "top_k": 2, "expert": expert}
    return {
        "dense": [f"model.ffn={json.dumps({'kind': 'swiglu', 'hidden': shape['hidden']})}"],
        "moe + balance loss": [f"model.ffn={json.dumps({**moe, 'balance_loss': 0.01})}"],
        "moe, no balancing": [f"model.ffn={json.dumps({**moe, 'balance_loss': 0.0})}"],
        "moe + bias balancing": [f"model.ffn={json.dumps({**moe, 'balance_loss': 0.0, 'router': {'kind': 'sigmoid_grouped', 'bias_update': 0.001}})}"],  # noqa: E501
    }


def active_parameters(total: int, shape: dict, name: str) -> int:
    """Parameters one token goes through: a mixture's router and 2 of its E experts (each a SwiGLU
    of 3·C·F/2 weights) in every layer, not the other E − 2 (``total``: all the model's)."""
    if name == "dense":
        return total
    per_expert = 3 * shape["dim"] * (shape["hidden"] // 2)
    return total - (shape["experts"] - 2) * per_expert * shape["layers"]


def imbalance(load: list[list[float]]) -> float:
    """The busiest expert's share of the assignments times E, averaged over the layers."""
    return sum(max(layer) * len(layer) for layer in load) / len(load)


def moe(quick: bool = False, log: Callable[[str], None] = print, folder: str | None = None,
        workers: int | None = None, report_only: bool = False) -> ExperimentResult:
    """Train the dense model and the three mixtures on sort with ``seqzoo compare`` (runs kept in
    ``folder``/moe-runs); loss, accuracy and expert load."""
    shape = QUICK if quick else FULL
    steps = shape["steps"]
    training = [f"train.task={json.dumps(shape['task'])}", "train.batch_size=32", "train.lr=3e-3",
                f"train.warmup={steps // 10}", f"train.log_every={shape['log_every']}",
                f"train.eval_examples={32 if quick else 256}", f"train.eval_every={steps}"]
    base = [f"model.dim={shape['dim']}", f"model.layers={shape['layers']}", "model.position.scaling=null"]
    arms = [Arm(name, "tiny-llama", (*base, *overrides)) for name, overrides in variants(shape).items()]
    threads = torch.get_num_threads()
    results = compare(arms, os.path.join(folder or tempfile.mkdtemp(prefix="seqzoo-moe-"), "moe-runs"), steps=steps,
                      seeds=[0], overrides=training, threads=threads,
                      workers=workers or max(1, (os.cpu_count() or 1) // threads),
                      log=log, report_only=report_only, every_run=True)
    rows, data = [], {"steps": [], "loss": {}, "imbalance": {}, "load": {}}
    for run in results["runs"]:
        name, history = run["arm"], run["curve"]
        data["steps"] = [h["step"] for h in history]
        data["loss"][name] = [h["loss"] for h in history]
        if "expert_load" in history[-1]:
            data["imbalance"][name] = [imbalance(h["expert_load"]) for h in history]
            data["load"][name] = [h["expert_load"] for h in history]
        quarters = [history[max(0, len(history) * q // 4 - 1)]["loss"] for q in (1, 2, 4)]
        final = data["imbalance"].get(name, [None])[-1]
        rows.append([name, run["parameters"], active_parameters(run["parameters"], shape, name), *quarters,
                     run["eval"]["accuracy"], "—" if final is None else round(final, 2),
                     round(run["train_seconds"], 1)])
    columns = ["model", "params", "active params", f"loss @{steps // 4}", f"loss @{steps // 2}", f"loss @{steps}",
               "held-out exact", "busiest expert × E (end)", "train s"]
    settings = {**shape, "train": {"lr": 3e-3, "batch_size": 32, "warmup": steps // 10},
                "variants": variants(shape), "top_k": 2}
    return ExperimentResult("moe", f"Dense SwiGLU against mixtures of {shape['experts']} half-width experts, top-2 "
                            f"(the same active parameters), on sort: {steps} steps, seed 0", columns, rows, settings,
                            data)


def draw(result: ExperimentResult, fig) -> None:
    """Loss against steps, and the busiest expert's share (× E) against steps."""
    data = result.data
    left, right = fig.subplots(1, 2)
    for name, loss in data["loss"].items():
        left.plot(data["steps"], loss, label=name)
    left.set(xlabel="training step", ylabel="training loss", yscale="log")
    for name, values in data["imbalance"].items():
        right.plot(data["steps"], values, label=name)
    right.axhline(1.0, color="grey", lw=0.8, ls="--")
    right.set(xlabel="training step", ylabel="busiest expert's share × E (1 = even)")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
