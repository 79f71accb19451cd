"""Capped, biased, windowed, sink and document-masked attention at long context, measured as a user
meets it (docs/performance.md, "Attention at long context"):

    python benchmarks/long_attention.py                  # T 8192, every row, fresh process each
    python benchmarks/long_attention.py --length 4096 --rows plain,softcap
    python benchmarks/long_attention.py --whole          # tiny-gemma2 as shipped against softcap and window off

Each row builds a one-layer model with ``seqzoo.build`` in a fresh process and runs one forward and
backward on a batch of 1 (C 256, 4 heads of 64, float32): the peak resident memory it grows by
(sampled every 2 ms from /proc/self/statm) and the wall time of that first step. A second column
repeats the step in the same process (warmed: whatever the first step paid once is paid). Run it
alone: the times are ratios to the plain causal layer's, and another process moves them.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

#: Every row: the recipe and its overrides (each a one-layer model: C 256, 4 heads of 64).
BASE = ["model.layers=1", "model.dim=256", "model.attention.heads=4", "model.attention.kv_heads=4",
        "model.attention.head_dim=64", "model.vocab_size=259"]
ROWS = {
    "plain": ("tiny-gemma2", ["model.attention.softcap=null", "model.final_softcap=null", "model.pattern=[global]"]),
    "softcap": ("tiny-gemma2", ["model.final_softcap=null", "model.pattern=[global]"]),
    "softcap+window": ("tiny-gemma2", ["model.final_softcap=null", "model.pattern=[local]",
                                       "model.layer_types.local.attention.window=1024"]),
    "alibi": ("tiny-bloom", []),
    "t5 bias": ("tiny-gpt", ["model.position={kind: t5, num_buckets: 32, max_distance: 128}"]),
    "sinks": ("tiny-sinks", ["model.pattern=[full]"]),
    "documents": ("tiny-gpt", ["model.position=rope"]),
}
#: Whole recipes as shipped (their own width and layers), against the same with the costly options off.
WHOLE = {
    "tiny-gemma2 off": ("tiny-gemma2", ["model.attention.softcap=null", "model.final_softcap=null",
                                        "model.layer_types.local.attention.window=null"]),
    "tiny-gemma2": ("tiny-gemma2", []),
}

STEP = r"""
import json, os, sys, threading, time
import torch
import seqzoo

recipe, overrides, length, documents = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
page = os.sysconf("SC_PAGE_SIZE")

def rss() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * page

model = seqzoo.build(recipe, [*overrides, f"model.max_seq_len={length}"], device="cpu")
ids = torch.randint(3, 259, (1, length + 1), generator=torch.Generator().manual_seed(0))
extra = {}
if documents:  # four packed documents, no token attends across
    extra["documents"] = (torch.arange(length)[None] * 4 // length)
peak, stop = [rss()], threading.Event()

def sample() -> None:
    while not stop.is_set():
        peak[0] = max(peak[0], rss())
        time.sleep(0.002)

def step() -> float:
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    model(ids[:, :-1], targets=ids[:, 1:], **extra).backward()
    return time.perf_counter() - start

base = rss()
sampler = threading.Thread(target=sample, daemon=True)
sampler.start()
first = step()
stop.set()
sampler.join()
first_peak = peak[0] - base
warm = min(step() for _ in range(2))
print(json.dumps({"peak_mib": first_peak / 2**20, "first_s": first, "warm_s": warm}))
"""


def measure(recipe: str, overrides: list[str], length: int, documents: bool) -> dict:
    out = subprocess.run([sys.executable, "-c", STEP, recipe, json.dumps(overrides), str(length),
                          "1" if documents else "0"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--repeats", type=int, default=1, help="fresh processes per row (medians)")
    parser.add_argument("--whole", action="store_true", help="whole recipes as shipped, not one layer")
    args = parser.parse_args()
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "")
    print(f"T {args.length}, batch 1, C 256, 4 heads of 64, float32; {cpu}, {os.cpu_count()} cores")
    results = {}
    rows = WHOLE if args.whole else {name: (recipe, [*BASE, *overrides]) for name, (recipe, overrides) in
                                      ((name, ROWS[name]) for name in args.rows.split(","))}
    for name, (recipe, overrides) in rows.items():
        runs = [measure(recipe, overrides, args.length, name == "documents") for _ in range(args.repeats)]
        results[name] = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    plain = results.get("tiny-gemma2 off" if args.whole else "plain")
    print("| layer | peak memory (first step) | × plain | first step | × plain | warmed step | × plain |")
    print("|---|---|---|---|---|---|---|")
    for name, r in results.items():
        def ratio(key: str, r: dict = r) -> str:
            return f"{r[key] / plain[key]:.2f}" if plain else "—"
        print(f"| {name} | {r['peak_mib']:,.0f} MiB | {ratio('peak_mib')} | {r['first_s']:.2f} s | {ratio('first_s')} "
              f"| {r['warm_s']:.2f} s | {ratio('warm_s')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
