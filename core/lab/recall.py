"""``seqzoo experiment recall``: multi-query associative recall (MQAR; Arora et al., 2023, "Zoology").

A sequence lists N key–value pairs, then asks for the keys again in a random order, each followed
by its value:

    k₁ v₁ k₂ v₂ … k_N v_N   q₁ v(q₁) q₂ v(q₂) … q_N v(q_N)

The loss and the accuracy count only the value after each queried key: to get it, the model must
find that key among the pairs and read the token after it. Attention can look the pair up
directly; a recurrent mixer must have kept it in a state of fixed size, which the pairs overflow
as N grows. That is the claim under test: a finite state loses token-level random access, and one
attention layer in four brings it back.

Four decoders of the same shape and parameter count differ in their token mixers: attention
(RoPE), Mamba, Mamba-2, and a hybrid of Mamba-2 layers with attention in every fourth. The two
state-space mixers keep the same state size per layer (E·N floats: Mamba's E channels × 16 states,
Mamba-2's 8 heads × 16 head dims × 16 states). Each trains on sequences whose N is drawn at every
step from the list, with a curriculum: over the first half of the steps the list grows from N = 4
one entry at a time. Without it, short runs stayed at a plateau where every model, attention
included, guesses among the values not yet asked for (the answers are in the sequence) and never
binds keys to values. Each model is scored per N on held-out sequences: the fraction of queried
values predicted right (teacher-forced, one forward pass, argmax at each query).

The task is the ``mqar`` task plugin and the runs are a ``seqzoo compare`` (one process per model
and seed, each resumable): this module only chooses the models and the settings and reads the
table back.
"""
from __future__ import annotations

import json
import os
import statistics
import tempfile
from collections.abc import Callable

import torch

from .compare import Arm, compare
from .result import ExperimentResult

#: Each model's overrides of the shared base; the FFN width is solved per model.
MIXERS: dict[str, list[str]] = {
    "attention": [],
    "mamba": ["model.mixer={kind: mamba, state: 16, expand: 2}", "model.position=none"],
    "mamba2": ["model.mixer={kind: mamba2, state: 16, head_dim: 16, expand: 2}", "model.position=none"],
    "hybrid 1:4": ["model.mixer={kind: mamba2, state: 16, head_dim: 16, expand: 2}",
                   "model.layer_types={ssm: {}, attention: {mixer: attention}}",
                   "model.pattern=[ssm, ssm, ssm, attention]"],
}
#: The order runs start in: Mamba's step costs the most (~6× attention's), so its runs go first.
SLOWEST_FIRST = ["mamba", "mamba2", "hybrid 1:4", "attention"]
FULL = {"dim": 64, "layers": 4, "hidden": 172, "keys": 64, "pairs": [4, 8, 16, 32], "steps": 2000,
        "batch": 64, "lr": 1e-3, "warmup": 100, "curriculum": 0.5, "eval": 256, "seeds": [0, 1]}
QUICK = {"dim": 32, "layers": 4, "hidden": 88, "keys": 16, "pairs": [2, 4], "steps": 4, "batch": 8, "lr": 2e-3,
         "warmup": 1, "curriculum": 0.5, "eval": 8, "seeds": [0]}


def arms(shape: dict) -> list[Arm]:
    """The four models, slowest first, as ``compare`` arms on the shared base (tiny-llama at the
    shape's width and depth, 4 heads, no RoPE scaling, tied embeddings)."""
    base = [f"model.dim={shape['dim']}", f"model.layers={shape['layers']}", "model.attention.heads=4",
            "model.attention.kv_heads=null", "model.position.scaling=null", "model.max_seq_len=512",
            "model.tie_embeddings=true", f"model.ffn.hidden={shape['hidden']}"]
    return [Arm(name, "tiny-llama", (*base, *MIXERS[name])) for name in ["attention", *SLOWEST_FIRST[:-1]]]


def training(shape: dict) -> list[str]:
    """The train: section every model shares: the ``mqar`` task with its curriculum (over the first
    ``curriculum`` of the rows), AdamW (weight decay 0.1), warm-up then cosine to 0, clip 1."""
    rows = shape["steps"] * shape["batch"]
    task = {"kind": "mqar", "pairs": shape["pairs"], "keys": shape["keys"],
            "curriculum": int(shape.get("curriculum", 0.0) * rows)}
    return [f"train.task={json.dumps(task)}", f"train.batch_size={shape['batch']}", f"train.lr={shape['lr']}",
            f"train.warmup={shape['warmup']}", "train.weight_decay=0.1", "train.min_lr_ratio=0.0",
            "train.grad_clip=1.0", "train.beta2=0.999", f"train.eval_examples={shape['eval']}",
            f"train.eval_every={shape['steps']}", "train.log_every=1"]


def recall(quick: bool = False, log: Callable[[str], None] = print, folder: str | None = None) -> ExperimentResult:
    """Train each mixer on MQAR per seed with ``seqzoo compare`` (its runs kept in ``folder``/runs,
    so an interrupted experiment continues); accuracy against the number of pairs."""
    shape = QUICK if quick else FULL
    folder = folder or tempfile.mkdtemp(prefix="seqzoo-recall-")
    threads = torch.get_num_threads()
    results = compare(arms(shape), os.path.join(folder, "recall-runs"), steps=shape["steps"], seeds=shape["seeds"],
                      overrides=training(shape), match_params=True, threads=threads,
                      workers=max(1, (os.cpu_count() or 1) // threads), log=log)
    order = list(MIXERS)
    scores: dict[str, list[list[float]]] = {name: [] for name in order}
    curves: dict[str, list[list[float]]] = {name: [] for name in order}
    counts: dict[str, int] = {}
    for run in sorted(results["runs"], key=lambda r: r["seed"]):
        groups = run["eval"]["groups"] if "groups" in run["eval"] else {f"N={shape['pairs'][0]}": run["eval"]}
        scores[run["arm"]].append([groups[f"N={n}"]["accuracy"] for n in shape["pairs"]])
        curves[run["arm"]].append([point["loss"] for point in run["curve"]])
        counts[run["arm"]] = run["parameters"]
    rows = [[name, counts[name], *[statistics.fmean(run[i] for run in runs) for i in range(len(shape["pairs"]))],
             " / ".join(f"{run[-1]:.2f}" for run in runs)] for name, runs in scores.items()]
    columns = ["mixer", "params", *[f"N={n}" for n in shape["pairs"]], f"N={shape['pairs'][-1]} per seed"]
    settings = {**shape, "mixers": MIXERS, "state_floats_per_layer": {"mamba": 2 * shape["dim"] * 16,
                                                                      "mamba2": 2 * shape["dim"] * 16},
                "sequence": "N pairs, then the N keys again in random order, each followed by its value",
                "optimizer": "AdamW, weight decay 0.1, clip 1.0, warm-up then cosine",
                "curriculum_rule": "over the first `curriculum` fraction of the rows, N from a list that grows by one"}
    data = {"pairs": shape["pairs"], "accuracy": {n: [statistics.fmean(c) for c in zip(*runs)]
                                                 for n, runs in scores.items()},
            "per_seed": scores, "loss": {n: [statistics.fmean(s) for s in zip(*runs)] for n, runs in curves.items()}}
    return ExperimentResult("recall", f"MQAR: accuracy of recalled values against the number of key–value "
                            f"pairs N ({shape['steps']} steps, mean of {len(shape['seeds'])} seed(s), equal "
                            f"parameter counts)", columns, rows, settings, data)


def draw(result: ExperimentResult, fig) -> None:
    """Accuracy against N, and the training loss (smoothed) against steps."""
    data = result.data
    left, right = fig.subplots(1, 2)
    for name, values in data["accuracy"].items():
        left.plot(data["pairs"], values, marker="o", ms=4, label=name)
    left.set_xscale("log", base=2)
    left.set_xticks(data["pairs"], [str(n) for n in data["pairs"]])
    left.set(xlabel="key–value pairs N", ylabel="recall accuracy", ylim=(-0.02, 1.02))
    for name, loss in data["loss"].items():
        window = max(1, len(loss) // 50)
        smooth = [statistics.fmean(loss[max(0, i - window):i + 1]) for i in range(len(loss))]
        right.plot(range(1, len(loss) + 1), smooth, label=name)
    right.set(xlabel="training step", ylabel="loss at the queries")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
