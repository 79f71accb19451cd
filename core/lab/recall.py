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
"""
from __future__ import annotations

import math
import multiprocessing
import os
import random
import statistics
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor

import torch

from ..io.build import build
from .measure import parameters, with_parameter_count
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
#: Token ids: keys from FIRST, values right after them (the bytes vocabulary holds both).
FIRST = 3
IGNORE = -100


def mqar_batch(batch: int, pairs: int, keys: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids (B, 4N), targets (B, 4N)): N pairs of distinct keys and random values, then every key
    again in a random order followed by its value. targets is the next token at each query key
    (its value) and IGNORE elsewhere, so a loss or an accuracy counts the recalled values only."""
    key_ids = torch.rand(batch, keys, generator=generator).argsort(-1)[:, :pairs] + FIRST      # (B, N)
    values = torch.randint(keys, (batch, pairs), generator=generator) + FIRST + keys              # (B, N)
    order = torch.rand(batch, pairs, generator=generator).argsort(-1)                            # (B, N)
    asked, answers = key_ids.gather(1, order), values.gather(1, order)
    ids = torch.stack([torch.stack([key_ids, values], -1), torch.stack([asked, answers], -1)], 1).flatten(1)
    targets = torch.full_like(ids, IGNORE)
    targets[:, 2 * pairs::2] = answers  # at each queried key, the value that follows it
    return ids, targets


def models(shape: dict, seed: int) -> dict[str, torch.nn.Module]:
    """The four models, each at the attention model's parameter count (its FFN width solved)."""
    def maker(extra: list[str]) -> Callable[..., torch.nn.Module]:
        def make(hidden: int, device: str = "cpu") -> torch.nn.Module:
            torch.manual_seed(seed)
            return build("tiny-llama", [f"model.dim={shape['dim']}", f"model.layers={shape['layers']}",
                                        "model.attention.heads=4", "model.attention.kv_heads=null",
                                        "model.position.scaling=null", "model.max_seq_len=512",
                                        "model.tie_embeddings=true", f"model.ffn.hidden={hidden}", *extra],
                         device=device, dtype="float32")
        return make

    target = parameters(maker([])(shape["hidden"], device="meta"))
    return {name: with_parameter_count(maker(extra), target) for name, extra in MIXERS.items()}


def allowed_pairs(pairs: list[int], step: int, steps: int, curriculum: float) -> list[int]:
    """The N a step may draw: over the first ``curriculum`` fraction of the steps the list grows
    one entry at a time in equal stages (N = 4, then 4 or 8, ...), then it is all of ``pairs``."""
    if curriculum <= 0:
        return pairs
    return pairs[:min(len(pairs), 1 + int(len(pairs) * step / (curriculum * steps)))]


def train_mqar(model: torch.nn.Module, shape: dict, seed: int) -> list[float]:
    """AdamW (weight decay 0.1) with linear warm-up and cosine decay; at each step N is drawn from
    the pairs the curriculum allows (``allowed_pairs``). Returns the loss of every step."""
    rng, generator = random.Random(seed), torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=shape["lr"], weight_decay=0.1)
    steps, warmup = shape["steps"], shape["warmup"]
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (
        1 + math.cos(math.pi * min(1.0, s / steps))))
    model.train()
    losses = []
    for step in range(steps):
        pairs = allowed_pairs(shape["pairs"], step, steps, shape.get("curriculum", 0.0))
        ids, targets = mqar_batch(shape["batch"], rng.choice(pairs), shape["keys"], generator)
        loss = model(ids, targets=targets)  # targets are already the next tokens
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
    return losses


def accuracy(model: torch.nn.Module, pairs: int, shape: dict, seed: int) -> float:
    """The fraction of queried values the model predicts (argmax) on held-out sequences."""
    ids, targets = mqar_batch(shape["eval"], pairs, shape["keys"], torch.Generator().manual_seed(10_000 + seed))
    model.eval()
    with torch.no_grad():
        predicted = model(ids).argmax(-1)  # (B, 4N)
    asked = targets != IGNORE
    return (predicted[asked] == targets[asked]).float().mean().item()


def run_one(name: str, shape: dict, seed: int, threads: int) -> tuple[int, list[float], list[float]]:
    """Build, train and score one model -> (parameters, the loss of every step, accuracy per N).
    Each run is seeded on its own, so it gives the same numbers in any process."""
    torch.set_num_threads(threads)
    model = models(shape, seed)[name]
    losses = train_mqar(model, shape, seed)
    return parameters(model), losses, [accuracy(model, n, shape, seed) for n in shape["pairs"]]


def recall(quick: bool = False, log: Callable[[str], None] = print) -> ExperimentResult:
    """Train each mixer on MQAR per seed; accuracy against the number of pairs. The runs are
    independent, so they go to as many worker processes as the cores hold at the current thread
    count (slowest model first, to balance them)."""
    shape = QUICK if quick else FULL
    scores: dict[str, list[list[float]]] = {}  # name -> per seed, accuracy per N
    curves: dict[str, list[list[float]]] = {}
    counts: dict[str, int] = {}
    threads = torch.get_num_threads()
    jobs = [(name, seed) for name in SLOWEST_FIRST for seed in shape["seeds"]]
    workers = max(1, min(len(jobs), (os.cpu_count() or 1) // threads))
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {job: pool.submit(run_one, job[0], shape, job[1], threads) for job in jobs}
        for (name, seed), future in futures.items():
            counts[name], losses, accuracies = future.result()
            curves.setdefault(name, []).append(losses)
            scores.setdefault(name, []).append(accuracies)
            log(f"seed {seed} {name:<11} {counts[name]:,} params: accuracy "
                + " ".join(f"N={n} {a:.3f}" for n, a in zip(shape["pairs"], accuracies)))
    order = list(MIXERS)
    scores = {n: scores[n] for n in order}
    curves = {n: curves[n] for n in order}
    rows = [[name, counts[name], *[statistics.fmean(run[i] for run in runs) for i in range(len(shape["pairs"]))],
             " / ".join(f"{run[-1]:.2f}" for run in runs)] for name, runs in scores.items()]
    columns = ["mixer", "params", *[f"N={n}" for n in shape["pairs"]], f"N={shape['pairs'][-1]} per seed"]
    settings = {**shape, "mixers": MIXERS, "state_floats_per_layer": {"mamba": 2 * shape["dim"] * 16,
                                                                      "mamba2": 2 * shape["dim"] * 16},
                "sequence": "N pairs, then the N keys again in random order, each followed by its value",
                "optimizer": "AdamW, weight decay 0.1, clip 1.0, warm-up then cosine",
                "curriculum_rule": "over the first `curriculum` fraction of the steps, N from a list that grows by one"}
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
