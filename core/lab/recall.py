"""``seqzoo experiment recall``: does a finite state lose random access? Multi-query associative
recall (MQAR) as Zoology runs it (Arora, Eyuboglu et al., 2023), with pre-registered criteria.

A row holds N key–value pairs, then each key once more as a query with filler around it; the label
at a query is its value, and the answers are never in the input (the ``mqar`` task). Attention
can look each pair up; a state-space model must have kept it in a state of fixed size, which the
pairs overflow as N grows. That is the articles' claim: a finite state has no token-level random
access, and attention in one layer of four brings it back.

The design (docs/experiments.md states it, and the criteria, before the results):
- contenders at equal parameter counts (the FFN width solved per model): attention (RoPE), Mamba
  at d_state 4, 16 and 64, Mamba-2 at 16 and 64, and, at four layers, a hybrid of Mamba-2 layers
  with attention in every fourth;
- two and four layers, C = 64, T = 256, N up to 64;
- a learning-rate sweep per contender on the first seed, then three seeds at its best rate;
- accuracy per N: the share of queried values the argmax predicts, on 1,000 held-out rows per N;
- the verdict computed from the table by ``sweep.verdict``, the pre-registered rule.

The runs are ``seqzoo compare`` runs kept in the output folder (``layersL/runs/...``), so an
interrupted study continues where it stopped; the result files of finished runs are what the
figures and tables are rebuilt from.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable

import torch

from .result import ExperimentResult
from .sweep import Contender, state_space_contenders, study, tabulate


def contenders(shape: dict, layers: int) -> list[Contender]:
    """Attention first (every parameter count is matched to it), then the SSMs by family and state,
    then the hybrid where the depth allows it."""
    found = [Contender("attention", "attention", None, ()),
             *state_space_contenders(shape["states"], shape.get("hybrid", False))]
    return [c for c in found if layers >= c.min_layers]


def vocabulary(needed: int) -> int:
    """A vocabulary that holds ``needed`` ids and the recipe's bytes tokenizer's 259 (the task's
    ids are not text, but the model is a text recipe), rounded up to a multiple of 64."""
    return 64 * math.ceil(max(needed, 259) / 64)


def base(shape: dict, layers: int) -> list[str]:
    """The shared model: tiny-llama at the shape's width and depth, tied embeddings, no RoPE scaling."""
    return [f"model.dim={shape['dim']}", f"model.layers={layers}", f"model.attention.heads={shape['heads']}",
            "model.attention.kv_heads=null", "model.position.scaling=null", f"model.max_seq_len={shape['seq_len']}",
            "model.tie_embeddings=true", f"model.ffn.hidden={shape['hidden']}",
            f"model.vocab_size={vocabulary(3 + 2 * shape['keys'])}"]


def training(shape: dict) -> list[str]:
    """The train: section every run shares but the rate: the ``mqar`` task, AdamW (weight decay
    0.1), warm-up then cosine to 0, clip 1, held-out accuracy ``evals`` times per run."""
    steps = shape["steps"]
    task = {"kind": "mqar", "pairs": shape["pairs"], "keys": shape["keys"], "seq_len": shape["seq_len"]}
    return [f"train.task={json.dumps(task)}", f"train.batch_size={shape['batch']}",
            f"train.warmup={max(1, steps // 20)}", "train.weight_decay=0.1", "train.min_lr_ratio=0.0",
            "train.grad_clip=1.0", "train.beta2=0.999", f"train.eval_examples={shape['eval']}",
            f"train.eval_every={max(1, steps // shape['evals'])}", f"train.log_every={max(1, steps // 100)}"]


FULL = {"dim": 64, "heads": 2, "hidden": 256, "layers": [2, 4], "keys": 512, "pairs": [4, 8, 16, 32, 64],
        "seq_len": 256, "steps": 4000, "batch": 64, "rates": [3e-4, 1e-3, 3e-3], "eval": 1000, "evals": 4,
        "seeds": [0, 1, 2], "states": {"mamba": [4, 16, 64], "mamba2": [16, 64]}, "hybrid": True}
QUICK = {"dim": 32, "heads": 2, "hidden": 64, "layers": [2], "keys": 16, "pairs": [2, 4], "seq_len": 16,
         "steps": 4, "batch": 8, "rates": [1e-3, 3e-3], "eval": 8, "evals": 1, "seeds": [0],
         "states": {"mamba": [4]}, "hybrid": False}


def recall(quick: bool = False, log: Callable[[str], None] = print, folder: str | None = None) -> ExperimentResult:
    """Run (or continue) the study at every depth; the table, the verdicts and the figure's data."""
    shape = QUICK if quick else FULL
    folder = folder or tempfile.mkdtemp(prefix="seqzoo-recall-")
    pairs, groups = shape["pairs"], [f"N={n}" for n in shape["pairs"]]
    rows, data, verdicts = [], {"pairs": pairs, "depths": {}}, {}
    for layers in shape["layers"]:
        who = contenders(shape, layers)
        found = study(who, base(shape, layers), training(shape), rates=shape["rates"], seeds=shape["seeds"],
                      steps=shape["steps"], folder=os.path.join(folder, f"layers{layers}"), metric="accuracy",
                      log=log, threads=torch.get_num_threads())
        depth, depth_rows = tabulate(who, found, groups, "accuracy", pairs, dim=shape["dim"], reference="attention")
        verdicts[layers] = depth["verdict"], depth["reasons"]
        rows += [[layers, *row] for row in depth_rows]
        data["depths"][str(layers)] = depth
    columns = ["layers", "model", "state floats / layer", "params", "best lr",
               *[f"N={n} ({n * math.log2(shape['keys']):.0f} bits)" for n in pairs], f"N={pairs[-1]} per seed"]
    overall = overall_verdict([v for v, _ in verdicts.values()])
    data["verdict"] = overall
    settings = {**shape, "bits_per_value": math.log2(shape["keys"]), "vocab_size": vocabulary(3 + 2 * shape["keys"]),
                "layout": "Zoology: N pairs, then each key once in a power-law query slot; answers never in the input",
                "optimizer": "AdamW, weight decay 0.1, clip 1.0, beta2 0.999, warm-up 5% then cosine to 0",
                "rate_choice": "the best mean accuracy over N on seed 0, then every seed at that rate"}
    notes = [f"{layers} layers: {v} — " + "; ".join(reasons) for layers, (v, reasons) in verdicts.items()]
    return ExperimentResult("recall", f"MQAR (Zoology layout): accuracy against N pairs at equal parameter counts, "
                            f"{shape['steps']} steps, best rate of {len(shape['rates'])}, {len(shape['seeds'])} "
                            f"seed(s) — verdict: {overall}", columns, rows, settings, data, notes)


def overall_verdict(verdicts: list[str]) -> str:
    """The pre-registered rule across depths: invalid if any depth is, supported only if every depth
    supports the claim, not supported if any depth does not, inconclusive otherwise."""
    if "invalid" in verdicts:
        return "invalid"
    if all(v == "supported" for v in verdicts):
        return "supported"
    return "not supported" if "not supported" in verdicts else "inconclusive"


def draw(result: ExperimentResult, fig) -> None:
    """Accuracy against N: one row of panels per depth, one panel per state size, one line per model
    (attention and the hybrid in every panel)."""
    data = result.data
    depths = list(data["depths"])
    states = sorted({s for d in data["depths"].values() for n, s in d["state"].items()
                     if s is not None and d["family"][n] != "hybrid"})
    fig.set_size_inches(max(10.0, 4.2 * len(states)), 4.0 * len(depths))
    axes = fig.subplots(len(depths), max(1, len(states)), squeeze=False)
    for row, layers in zip(axes, depths):
        depth = data["depths"][layers]
        for ax, state in zip(row, states):
            for name, means in depth["means"].items():
                family = depth["family"][name]
                if family in ("attention", "hybrid") or depth["state"][name] == state:
                    ax.plot(data["pairs"], means, marker="o", ms=4, label=name,
                            ls="--" if family in ("attention", "hybrid") else "-")
            ax.set_xscale("log", base=2)
            ax.set_xticks(data["pairs"], [str(n) for n in data["pairs"]])
            ax.set(xlabel="key–value pairs N", ylabel="recall accuracy", ylim=(-0.02, 1.02),
                   title=f"{layers} layers, SSM state N={state}")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
