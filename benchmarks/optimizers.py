"""What Muon's optimizer step costs within a whole training step, against AdamW's, for the LLaMA
block of examples/compare (docs/compare.md) on the CPU:

    python benchmarks/optimizers.py                       # batch 16 × 256 tokens, 20 rounds
    python benchmarks/optimizers.py --rounds 40 --threads 2 --json optimizers.json

Two copies of examples/compare/llama.yaml's model (C 256, 4 layers, GQA 4/2, SwiGLU 688, tied
embeddings; one initialisation) train side by side on the same rows, one with each optimizer as
``seqzoo train`` builds it (``seqzoo.train.optimization.optimizer_for``): Muon on the hidden
matrices (Newton–Schulz in bfloat16) beside AdamW on the rest, against fused AdamW on everything.
A step is what the trainer does — zero the gradients, forward with the fused loss, backward, clip,
``optimizer.step()`` — timed whole and its optimizer step alone. The two optimizers alternate
within each round, in an order that flips every round, so a slow moment of the machine falls on
both; the table gives medians over the rounds, after warm-up rounds. Run it alone: another process
on the machine moves every number.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

import seqzoo
from seqzoo.config import TrainConfig
from seqzoo.train.optimization import optimizer_for

RECIPE = Path(__file__).resolve().parents[1] / "examples" / "compare" / "llama.yaml"
OPTIMIZERS = ("adamw", "muon")


def build(name: str, overrides: list[str]):
    """The model (the same initialisation for every optimizer) and its optimizer as training makes it."""
    torch.manual_seed(0)
    model = seqzoo.build(str(RECIPE), overrides, device="cpu").train()
    config = TrainConfig(optimizer=name, lr=1e-3, weight_decay=0.1)  # examples/compare/base.yaml's settings
    return model, optimizer_for(model, config)


def step(model, optimizer, ids: torch.Tensor) -> tuple[float, float]:
    """One training step as the trainer takes it -> (whole step, optimizer step) in seconds."""
    start = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    model(ids[:, :-1], targets=ids[:, 1:]).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    before = time.perf_counter()
    optimizer.step()
    end = time.perf_counter()
    return end - start, end - before


def measure(rounds: int, warmup: int, batch: int, seq_len: int, overrides: list[str]) -> dict:
    runs = {name: build(name, overrides) for name in OPTIMIZERS}
    in_muon = sum(p.numel() for p in runs["muon"][1].param_groups[0]["params"])  # its first group: the matrices
    generator = torch.Generator().manual_seed(0)
    times: dict[str, dict[str, list[float]]] = {name: {"step": [], "optimizer": []} for name in OPTIMIZERS}
    for index in range(warmup + rounds):
        ids = torch.randint(3, 259, (batch, seq_len + 1), generator=generator)
        order = OPTIMIZERS if index % 2 == 0 else OPTIMIZERS[::-1]
        for name in order:
            whole, optimizer_part = step(*runs[name], ids)
            if index >= warmup:
                times[name]["step"].append(whole)
                times[name]["optimizer"].append(optimizer_part)
    medians = {name: {part: statistics.median(values) for part, values in parts.items()}
               for name, parts in times.items()}
    return {"recipe": str(RECIPE.relative_to(RECIPE.parents[2])), "batch": batch, "seq_len": seq_len,
            "rounds": rounds, "warmup": warmup, "threads": torch.get_num_threads(), "torch": torch.__version__,
            "muon_matrices": in_muon, "medians": medians,
            "step_ratio": medians["muon"]["step"] / medians["adamw"]["step"],
            "optimizer_ratio": medians["muon"]["optimizer"] / medians["adamw"]["optimizer"]}


def table(result: dict) -> str:
    m = result["medians"]
    lines = [f"{result['recipe']}: batch {result['batch']} × {result['seq_len']} tokens, {result['threads']} "
             f"thread(s), torch {result['torch']}; medians of {result['rounds']} interleaved rounds "
             f"(after {result['warmup']} warm-up)",
             "| optimizer | whole step (ms) | optimizer step (ms) | optimizer share |", "|---|---|---|---|"]
    for name in OPTIMIZERS:
        lines.append(f"| {name} | {m[name]['step'] * 1e3:.1f} | {m[name]['optimizer'] * 1e3:.1f} | "
                     f"{m[name]['optimizer'] / m[name]['step']:.1%} |")
    lines.append(f"Muon's whole step / AdamW's: {result['step_ratio']:.3f}×; optimizer step alone: "
                 f"{result['optimizer_ratio']:.2f}× ({result['muon_matrices']:,} parameters in Muon's matrices)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20, help="measured rounds, each one step per optimizer (20)")
    parser.add_argument("--warmup", type=int, default=3, help="rounds before measuring (3)")
    parser.add_argument("--batch", type=int, default=16, help="rows per step (16, examples/compare's)")
    parser.add_argument("--seq-len", type=int, default=256, help="tokens per row (256, examples/compare's)")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="an override of the recipe (repeatable; e.g. model.layers=2 for a quick run)")
    parser.add_argument("--json", metavar="FILE", help="also write the result here")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    result = measure(args.rounds, args.warmup, args.batch, args.seq_len, args.overrides)
    print(table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
