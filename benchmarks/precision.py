"""What bfloat16 autocast buys a whole training step on this CPU, against float32, and what
``precision: auto`` picks here (docs/performance.md, "Precision on the CPU"):

    python benchmarks/precision.py                        # LLaMA blocks, C 768, 4 layers, batch 4 × 512
    python benchmarks/precision.py --threads 2 --rounds 10 --json precision.json
    python benchmarks/precision.py --set model.dim=256 --batch 16 --seq-len 256   # examples/compare's size

The model is examples/compare/llama.yaml's block (RoPE, RMSNorm, GQA, SwiGLU) at the issue's size:
C 768, 12 heads (4 key/value), SwiGLU 2048, 4 layers, the bytes vocabulary. One copy of it trains
under each precision as the trainer runs it (``seqzoo.train.precision.autocast_for``): the forward
and the fused loss under the autocast context, the backward outside it, gradient clipping, fused
AdamW, float32 master weights in both. The two alternate within each round, in an order that flips
every round, so a slow moment of the machine falls on both; the table gives medians after warm-up.
The probe's two matrix-product rates (``seqzoo.train.precision``) are printed beside them, with
the CPU's model, its bfloat16 flags and the instruction-set caps in force. Run it alone: another
process moves every number. A CPU without bfloat16 instructions is imitated on one that has them by
capping oneDNN and MKL at its instruction set:

    ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 python benchmarks/precision.py ...
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

import seqzoo
from seqzoo.config import TrainConfig
from seqzoo.train.machine import ISA_CAPS, device_name
from seqzoo.train.optimization import optimizer_for
from seqzoo.train.precision import autocast_for, cpu_flags, model_width, probe, resolve

RECIPE = Path(__file__).resolve().parents[1] / "examples" / "compare" / "llama.yaml"
SIZE = ["model.dim=768", "model.attention.heads=12", "model.attention.kv_heads=4", "model.ffn.hidden=2048",
        "model.layers=4", "model.max_seq_len=512"]
PRECISIONS = ("float32", "bfloat16")


def build(precision: str, overrides: list[str]):
    """(model, optimizer, the trainer's precision) for ``precision``; one initialisation for both."""
    torch.manual_seed(0)
    model = seqzoo.build(str(RECIPE), [*SIZE, *overrides], device="cpu").train()
    config = TrainConfig(optimizer="adamw", lr=1e-3, weight_decay=0.1, precision=precision)
    return model, optimizer_for(model, config), resolve(precision, torch.device("cpu"))


def step(model, optimizer, precision, ids: torch.Tensor) -> float:
    """One training step as the trainer takes it, in seconds."""
    start = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    with autocast_for(precision, torch.device("cpu")):
        loss = model(ids[:, :-1], targets=ids[:, 1:])
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return time.perf_counter() - start


def measure(rounds: int, warmup: int, batch: int, seq_len: int, overrides: list[str]) -> dict:
    runs = {name: build(name, overrides) for name in PRECISIONS}
    generator = torch.Generator().manual_seed(0)
    times: dict[str, list[float]] = {name: [] for name in PRECISIONS}
    for index in range(warmup + rounds):
        ids = torch.randint(3, 259, (batch, seq_len + 1), generator=generator)
        for name in PRECISIONS if index % 2 == 0 else PRECISIONS[::-1]:
            took = step(*runs[name], ids)
            if index >= warmup:
                times[name].append(took)
    medians = {name: statistics.median(values) for name, values in times.items()}
    chosen = probe(torch.device("cpu"), model_width(runs["float32"][0]))
    caps = {name: os.environ[name] for name in ISA_CAPS if os.environ.get(name)}
    return {"cpu": device_name(torch.device("cpu")), "flags": cpu_flags(), "caps": caps,
            "threads": torch.get_num_threads(),
            "torch": torch.__version__, "batch": batch, "seq_len": seq_len, "rounds": rounds, "warmup": warmup,
            "overrides": [*SIZE, *overrides], "medians": medians, "speedup": medians["float32"] / medians["bfloat16"],
            "probe": {"float32": chosen.rates["float32"], "bfloat16": chosen.rates["bfloat16"],
                      "auto": chosen.dtype_name}}


def table(result: dict) -> str:
    probe_rates = result["probe"]
    flags = ", ".join(result["flags"]) or "no bfloat16 flags"
    caps = "".join(f", capped at {name}={value}" for name, value in result["caps"].items())
    lines = [f"{result['cpu']} ({flags}{caps}), {result['threads']} thread(s), "
             f"torch {result['torch']}; batch {result['batch']} × {result['seq_len']} tokens; medians of "
             f"{result['rounds']} interleaved rounds (after {result['warmup']} warm-up)",
             "| precision | whole step (ms) |", "|---|---|"]
    for name in PRECISIONS:
        lines.append(f"| {name} | {result['medians'][name] * 1e3:.0f} |")
    lines.append(f"bfloat16 autocast: {result['speedup']:.2f}× float32's speed; the probe: float32 "
                 f"{probe_rates['float32'] / 1e9:.0f} GFLOP/s, bfloat16 {probe_rates['bfloat16'] / 1e9:.0f} GFLOP/s "
                 f"-> auto picks {probe_rates['auto']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="measured rounds, each one step per precision (10)")
    parser.add_argument("--warmup", type=int, default=2, help="rounds before measuring (2)")
    parser.add_argument("--batch", type=int, default=4, help="rows per step (4)")
    parser.add_argument("--seq-len", type=int, default=512, help="tokens per row (512)")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="an override of the model (repeatable)")
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
