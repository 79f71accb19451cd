"""The hybrid era's mixers against attention and Mamba-2 on the CPU (docs/performance.md, "The
hybrid mixers"):

    python benchmarks/mixers.py                       # every mixer: training step, memory, decoding
    python benchmarks/mixers.py --only gated_deltanet,attention --length 1024

Each model is tiny-llama's block at C 256, 4 layers, heads of 64, with one token mixer in every
layer and a SwiGLU FFN whose width is solved so every model has the attention model's parameter
count. Measured, float32, on torch's default threads (run it alone: the study and any test run
paused, since another process moves the ratios by 2×):

- a training step (forward + backward of the next-token loss, batch 4, T 2048), the models taking
  turns so a slow spell of the machine falls on all of them; medians of ``--repeats``;
- gated DeltaNet's chunked delta rule against its own token-by-token recurrence
  (``seqzoo.reference.delta_rule``), forward + backward, at the same shapes;
- the peak memory of a training step (batch 1) at T 2048, 4096 and 8192, and its log–log slope;
- one cached greedy decoding step (batch 1) after contexts of 128 and 4096 tokens.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

import seqzoo
from seqzoo.lab.measure import decode_ms_per_token, loglog_slope, match_parameters, parameters, peak_memory_mb
from seqzoo.registry import registry

#: The token mixer of every layer, per row; the recurrent ones need no position scheme.
MIXERS = {
    "attention": [],
    "mamba2": ["model.mixer={kind: mamba2, state: 64, head_dim: 64, expand: 2}"],
    "gated_deltanet": ["model.mixer={kind: gated_deltanet, heads: 4, head_dim: 64}"],
    "kda": ["model.mixer={kind: kda, heads: 4, head_dim: 64}"],
    "rwkv7": ["model.mixer={kind: rwkv7, head_dim: 64}"],
    "rwkv4": ["model.mixer={kind: rwkv4}"],
    "gla": ["model.mixer={kind: gla, heads: 4, head_dim: 64}"],
    "mlstm": ["model.mixer={kind: mlstm, heads: 4}"],
    "short_conv": ["model.mixer={kind: short_conv}"],
    "rg_lru": ["model.mixer={kind: rg_lru, heads: 4}"],
}
BASE = ["model.dim=256", "model.layers=4", "model.attention.heads=4", "model.attention.kv_heads=4",
        "model.position.scaling=null", "model.ffn.hidden=688", "model.tie_embeddings=true"]


def build(name: str, longest: int, target: int | None) -> torch.nn.Module:
    overrides = [*BASE, f"model.max_seq_len={longest}", *MIXERS[name]]
    if MIXERS[name]:
        overrides.append("model.position=none")
        overrides += match_parameters("tiny-llama", overrides, target, name)
    torch.manual_seed(0)
    return seqzoo.build("tiny-llama", overrides, device="cpu", dtype="float32")


def step_ms(model: torch.nn.Module, ids: torch.Tensor) -> float:
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    model(ids[:, :-1], targets=ids[:, 1:]).backward()
    return (time.perf_counter() - start) * 1000


def delta_rule_against_its_loop(batch: int, length: int) -> tuple[float, float]:
    """(chunked ms, token-by-token ms) for forward + backward of the gated delta rule at the
    benchmark's shape: 4 heads of 64, L2-normed keys, β and decays as the mixer makes them."""
    from seqzoo.plugins.mixer._delta_rule import chunked
    from seqzoo.reference.delta_rule import delta_rule

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, length, 4, 64, generator=g) for _ in range(3))
    q, k = torch.nn.functional.normalize(q, dim=-1) * 64 ** -0.5, torch.nn.functional.normalize(k, dim=-1)
    beta, decay = torch.rand(batch, length, 4, generator=g), -torch.rand(batch, length, 4, generator=g) * 0.1
    runs = {"chunked": lambda q, k, v, b, g: chunked(q, k, v, b, g, None, 64),
            "loop": lambda q, k, v, b, g: delta_rule(q, k, v, b, g, scale=1.0)}
    times = {}
    for name, fn in runs.items():
        inputs = [x.clone().requires_grad_() for x in (q, k, v, beta, decay)]
        start = time.perf_counter()
        out, _ = fn(*inputs)
        out.square().mean().backward()
        times[name] = (time.perf_counter() - start) * 1000
    return times["chunked"], times["loop"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated rows (default: every registered mixer)")
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--memory-lengths", default="2048,4096,8192")
    args = parser.parse_args()
    known = registry().names("mixer")
    names = [n for n in (args.only.split(",") if args.only else MIXERS) if n == "attention" or
             MIXERS[n][0].split("kind: ")[1].split(",")[0].rstrip("}") in known]
    memory_lengths = [int(n) for n in args.memory_lengths.split(",")]
    longest = max(memory_lengths + [args.length, 4096 + 64])
    target = parameters(build("attention", longest, None))
    models = {name: build(name, longest, target) for name in names}
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "")
    print(f"C 256, 4 layers, float32, {torch.get_num_threads()} threads; {cpu}, {os.cpu_count()} cores")

    ids = torch.randint(3, 259, (args.batch, args.length + 1), generator=torch.Generator().manual_seed(0))
    steps = {name: [] for name in names}
    for name in names:  # warm every path once
        step_ms(models[name].train(), ids)
    for _ in range(args.repeats):
        for name in names:  # the models take turns
            steps[name].append(step_ms(models[name], ids))
    memory = {name: [] for name in names}
    for length in memory_lengths:
        one = torch.randint(3, 259, (1, length + 1), generator=torch.Generator().manual_seed(length))
        for name in names:
            memory[name].append(peak_memory_mb(lambda m=models[name], ids=one: step_ms(m, ids)))
    decode = {name: [decode_ms_per_token(models[name].eval(), c, 259) for c in (128, 4096)] for name in names}

    attention = statistics.median(steps["attention"]) if "attention" in steps else None
    print(f"\n| mixer | params | step ms (batch {args.batch}, T {args.length}) | × attention | "
          + " | ".join(f"MiB @{n}" for n in memory_lengths) + " | memory slope | decode ms @128 | @4096 | ratio |")
    print("|---|---|---|---|" + "---|" * len(memory_lengths) + "---|---|---|---|")
    for name in names:
        ms = statistics.median(steps[name])
        ratio = f"{ms / attention:.2f}" if attention else "—"
        mib = " | ".join(f"{m:,.0f}" for m in memory[name])
        print(f"| {name} | {parameters(models[name]):,} | {ms:,.0f} ({' / '.join(f'{s:,.0f}' for s in steps[name])}) "
              f"| {ratio} | {mib} | {loglog_slope(memory_lengths, memory[name]):.2f} | {decode[name][0]:.2f} "
              f"| {decode[name][1]:.2f} | {decode[name][1] / decode[name][0]:.2f} |")
    if "gated_deltanet" in names:
        chunked, loop = delta_rule_against_its_loop(args.batch, args.length)
        print(f"\ngated delta rule, forward + backward, batch {args.batch}, T {args.length}, 4 heads of 64: "
              f"chunked {chunked:,.0f} ms, token by token {loop:,.0f} ms ({loop / chunked:.1f}×)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
