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
  with attention in every fourth; and a trainability control outside the verdict, Mamba at d_state
  16 started as linear attention (``mimetic``, Trockman et al., 2024);
- two and four layers, C = 128, N up to 64 in rows of T = 4N tokens (Zoology pairs each N with its T);
- a learning-rate sweep per contender on the first seed, then three seeds at its best rate;
- accuracy per N: the share of queried values the argmax predicts, on 500 held-out rows per N;
- the verdict computed from the table by ``sweep.verdict``, the pre-registered rule.

The runs are ``seqzoo compare`` runs kept in the output folder (``layersL/runs/...``), so an
interrupted study continues where it stopped; the result files of finished runs are what the
figures and tables are rebuilt from.
"""
from __future__ import annotations

import math
import tempfile
from collections.abc import Callable

import torch

from .result import ExperimentResult
from .sweep import (
    OPTIMIZER,
    Contender,
    every_depth,
    line_style,
    model_base,
    state_space_contenders,
    training,
    vocabulary,
)


def contenders(shape: dict, layers: int) -> list[Contender]:
    """Attention first (every parameter count is matched to it), then the SSMs by family and state,
    then the hybrid where the depth allows it."""
    found = [Contender("attention", "attention", None, ()),
             *state_space_contenders(shape["states"], shape.get("hybrid", False), shape.get("mimetic"))]
    return [c for c in found if layers >= c.min_layers]


#: The budget the calibration fixed (docs/experiments.md, before any comparison): at C = 64 attention
#: learned MQAR in one seed of three tried (512 keys never; 64 keys by step 1,600 in seed 0 only);
#: at C = 128 with two heads it held 0.999 by step 800 in a seed where C = 64 stayed at 0.14; in
#: seed 0 it left the plateau only between steps 800 and 1,200 (0.80 at 1,200), so 3,000 steps.
FULL = {"dim": 128, "heads": 2, "hidden": 256, "layers": [2, 4], "keys": 64, "pairs": [4, 8, 16, 32, 64],
        "length_per_pair": 4, "steps": 3000, "batch": 64, "rates": [3e-4, 1e-3, 3e-3], "eval": 500, "evals": 3,
        "seeds": [0, 1, 2], "states": {"mamba": [4, 16, 64], "mamba2": [16, 64]},
        "mimetic": {"mamba": [16]}, "hybrid": True}
QUICK = {"dim": 32, "heads": 2, "hidden": 64, "layers": [2], "keys": 16, "pairs": [2, 4], "length_per_pair": 4,
         "steps": 4, "batch": 8, "rates": [1e-3, 3e-3], "eval": 8, "evals": 1, "seeds": [0],
         "states": {"mamba": [4]}, "hybrid": False}


def design(shape: dict) -> dict:
    """What every depth of the study shares, as ``every_depth`` takes it: the contenders and the
    model base per depth, the training, the groups of held-out rows and their x, the metric and the
    reference (the second study, ``delta``, reads the same)."""
    pairs, vocab = shape["pairs"], vocabulary(3 + 2 * shape["keys"])
    task = {"kind": "mqar", "pairs": pairs, "keys": shape["keys"], "length_per_pair": shape["length_per_pair"]}
    longest = shape["length_per_pair"] * pairs[-1]
    return {"contenders": lambda layers: contenders(shape, layers),
            "base": lambda layers: model_base(shape, layers, max_seq_len=longest, vocab_size=vocab),
            "train": training(shape, task), "groups": [f"N={n}" for n in pairs], "xs": pairs, "metric": "accuracy",
            "reference": "attention", "checked": None}


def recall(quick: bool = False, log: Callable[[str], None] = print, folder: str | None = None,
           workers: int | None = None, report_only: bool = False) -> ExperimentResult:
    """Run (or continue) the study at every depth; the table, the verdicts and the figure's data."""
    shape = QUICK if quick else FULL
    pairs, vocab = shape["pairs"], vocabulary(3 + 2 * shape["keys"])
    done = every_depth(shape, folder or tempfile.mkdtemp(prefix="seqzoo-recall-"), **design(shape), log=log,
                       threads=torch.get_num_threads(), workers=workers, report_only=report_only)
    columns = ["layers", "model", "state floats / layer", "params", "best lr",
               *[f"N={n} ({n * math.log2(shape['keys']):.0f} bits)" for n in pairs], f"N={pairs[-1]} per seed"]
    data = {"pairs": pairs, "depths": done.data, "verdict": done.verdict}
    settings = {**shape, "bits_per_value": math.log2(shape["keys"]), "vocab_size": vocab, "optimizer": OPTIMIZER,
                "layout": "Zoology: N pairs, then each key once in a power-law query slot; answers never in the input",
                "rate_choice": "the best mean accuracy over N on seed 0, then every seed at that rate"}
    return ExperimentResult("recall", f"MQAR (Zoology layout): accuracy against N pairs at equal parameter counts, "
                            f"{shape['steps']} steps, best rate of {len(shape['rates'])}, {len(shape['seeds'])} "
                            f"seed(s) — verdict: {done.verdict}", columns, done.rows, settings, data, done.notes())


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
                    ax.plot(data["pairs"], means, marker="o", ms=4, label=name, ls=line_style(family))
            ax.set_xscale("log", base=2)
            ax.set_xticks(data["pairs"], [str(n) for n in data["pairs"]])
            ax.set(xlabel="key–value pairs N", ylabel="recall accuracy", ylim=(-0.02, 1.02),
                   title=f"{layers} layers, SSM state N={state}")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
