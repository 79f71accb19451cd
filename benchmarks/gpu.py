"""GPT-2 small on one CUDA GPU: training tokens/s and MFU at sequence 1024, and greedy-decoding
tokens/s — seqzoo's shipped ``gpt2`` recipe against transformers' GPT2LMHeadModel of the same shapes.

    python benchmarks/gpu.py                # the full run (a few minutes on an H200)
    python benchmarks/gpu.py --quick        # fewer steps and tokens: a smoke run
    bash benchmarks/gpu_check.sh [DIR]      # tests/test_cuda.py, then this; output in DIR ($OUT if set)

Training: vocabulary 50257, width 768, 12 layers, 12 heads, sequence 1024, dropout off on both
sides (the recipe's 0.1 would time the dropout masks), random weights and tokens; float32 weights
under bfloat16 autocast; fused AdamW; a few warm-up steps, then timed steps between
``torch.cuda.synchronize()`` calls. seqzoo trains through ``model(ids, targets=...)`` (the loss
fused with the LM head), transformers through ``labels=`` (its own loss, ``shift_labels`` so both
score the same 1024 positions), with ``attn_implementation="sdpa"``.

Decoding: greedy, a 64-token prompt then 256 new tokens (no end token on either side), batch 1 and
8, bfloat16 weights. seqzoo eager and ``compile=True`` (static KV cache, compiled decode step; the
first call, which compiles, is timed apart); transformers' ``generate`` with its default dynamic
cache, and with ``cache_implementation="static"`` (which transformers compiles itself) when that
works. Tokens/s = batch × new tokens / wall time of the whole call, prompt included; the median of
a few calls.

MFU convention (nanoGPT's, after PaLM appendix B): training FLOPs per token = 6·N + 12·L·C·T, with
N the parameters that enter a matrix product — every parameter but the embedding tables that are
only looked up (GPT-2's 1024×768 position table; its token table counts once, as the tied LM
head: N = 123,653,376 of 124,439,808) — L layers, C the width and T the sequence length (the
attention scores and their weighted sum, forward and backward, without discounting the causal
half). MFU = FLOPs per token × tokens/s / peak, peak = ``--peak-tflops`` (default 989, the dense
bfloat16 rate of an H200 SXM, the same chip as the H100 SXM). Both libraries are scored with the
same FLOPs per token: the model's arithmetic, not what each implementation spends.

Needs CUDA (exits 1 with one line otherwise); transformers is optional (its rows are skipped).
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

import seqzoo
from seqzoo.recipe import resolve

#: Dense (no sparsity) bfloat16 tensor-core peak of an H200 SXM / H100 SXM, TFLOP/s.
H200_BF16_PEAK_TFLOPS = 989.0


@dataclass
class Settings:
    batch: int = 16  # sequences per training step: 16 × 1024 tokens fits an 80 GB card for both
    seq: int = 1024
    warmup: int = 3
    steps: int = 10
    prompt: int = 64
    new_tokens: int = 256
    decode_batches: tuple[int, ...] = (1, 8)
    repeats: int = 3  # decode calls timed per row (median)


QUICK = Settings(batch=8, warmup=1, steps=3, new_tokens=32, repeats=1)


# -- FLOP accounting (pure functions; tests/test_benchmarks.py checks them) ---------------------------
def matmul_params(model: nn.Module) -> int:
    """N of the MFU formula: the parameters that enter a matrix product — all of them except the
    ``nn.Embedding`` tables that are only looked up (a table tied to an ``nn.Linear``, the LM head,
    counts once, as the head's product). Shared parameters are counted once."""
    products = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    lookups = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)} - products
    return sum(p.numel() for p in model.parameters() if id(p) not in lookups)


def train_flops_per_token(n_params: int, layers: int, dim: int, seq: int) -> int:
    """Training FLOPs per token: 6·N for the weights' products (forward 2·N, backward 4·N) plus
    12·L·C·T for attention (q·kᵀ and the weighted sum of v: 2·2·C·T a layer forward, twice that
    backward), causal masking not discounted — nanoGPT's ``estimate_mfu`` and PaLM's count."""
    return 6 * n_params + 12 * layers * dim * seq


def mfu(tokens_per_s: float, flops_per_token: float, peak_tflops: float) -> float:
    """Model FLOPs utilisation: achieved model FLOP/s over the peak, as a fraction."""
    return tokens_per_s * flops_per_token / (peak_tflops * 1e12)


# -- models ------------------------------------------------------------------------------------------
#: The benchmarked recipe: the shipped GPT-2 small with dropout off (the recipe's 0.1 would time
#: the dropout masks, which transformers' model then has to draw too).
RECIPE = "gpt2"
OVERRIDES = ["model.dropout=0.0"]


def gpt2_shapes() -> dict[str, int]:
    """vocab, dim, layers, heads, positions and FFN width of the resolved recipe: what
    transformers' model is built with, and what the FLOP count reads."""
    model = resolve(RECIPE, OVERRIDES).data["model"]
    return {"vocab": model["vocab_size"], "dim": model["dim"], "layers": model["layers"],
            "heads": model["attention"]["heads"], "positions": model["max_seq_len"],
            "hidden": model["ffn"]["hidden"]}


def seqzoo_gpt2(dtype: str) -> nn.Module:
    return seqzoo.build(RECIPE, OVERRIDES, device="cuda", dtype=dtype)


def transformers_gpt2(dtype: torch.dtype) -> nn.Module | None:
    """GPT2LMHeadModel with the recipe's shapes (tanh GELU, tied head, LayerNorm eps 1e-5), random
    weights, SDPA attention, no dropout; None when transformers is not installed."""
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        return None
    shapes = gpt2_shapes()
    config = GPT2Config(vocab_size=shapes["vocab"], n_positions=shapes["positions"], n_embd=shapes["dim"],
                        n_layer=shapes["layers"], n_head=shapes["heads"], n_inner=shapes["hidden"],
                        activation_function="gelu_new", layer_norm_epsilon=1e-5, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="sdpa")
    return GPT2LMHeadModel(config).to("cuda", dtype)


def next_token_loss(model: nn.Module, ids: Tensor) -> Tensor:
    """The mean next-token loss of ids (B, T + 1) over T positions, each library's own way."""
    inputs, targets = ids[:, :-1], ids[:, 1:]
    if type(model).__module__.startswith("transformers"):
        return model(input_ids=inputs, labels=inputs, shift_labels=targets.contiguous()).loss
    return model(inputs, targets=targets)


def release() -> None:
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


# -- training --------------------------------------------------------------------------------------
def bench_training(name: str, model: nn.Module, s: Settings, flops_per_token: int, peak: float) -> dict:
    """tokens/s, ms/step, MFU and peak memory of bf16-autocast training steps with fused AdamW."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    generator = torch.Generator(device="cuda").manual_seed(0)
    ids = torch.randint(0, gpt2_shapes()["vocab"], (s.batch, s.seq + 1), device="cuda", generator=generator)

    def step() -> Tensor:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = next_token_loss(model, ids)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss

    try:
        for _ in range(s.warmup):
            loss = step()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(s.steps):
            loss = step()
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    except torch.OutOfMemoryError:
        row = {"what": f"train {name}", "error": f"out of memory at batch {s.batch}; try --batch {s.batch // 2}"}
        print(f"{row['what']:<52} {row['error']}", flush=True)
        return row
    tokens_per_s = s.batch * s.seq * s.steps / seconds
    row = {"what": f"train {name}", "tokens_per_s": tokens_per_s, "ms_per_step": 1000 * seconds / s.steps,
           "mfu": mfu(tokens_per_s, flops_per_token, peak), "loss": loss.item(),
           "peak_memory_gib": torch.cuda.max_memory_allocated() / 2 ** 30}
    print(f"{row['what']:<52} {tokens_per_s:>10,.0f} tokens/s  {row['ms_per_step']:7.1f} ms/step  "
          f"MFU {row['mfu']:6.1%}  peak memory {row['peak_memory_gib']:5.1f} GiB  loss {row['loss']:.3f}",
          flush=True)
    return row


# -- decoding --------------------------------------------------------------------------------------
def timed(run: Callable[[], Tensor], repeats: int) -> tuple[float, Tensor]:
    """Median seconds of ``repeats`` calls (after one warm-up call) and the last output."""
    out = run()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = run()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def bench_decoding(s: Settings, with_transformers: bool) -> list[dict]:
    rows: list[dict] = []
    ours = seqzoo_gpt2("bfloat16").eval()
    theirs = transformers_gpt2(torch.bfloat16) if with_transformers else None
    if theirs is not None:
        theirs.eval()
        # No end token: both sides emit exactly new_tokens and suppress nothing.
        theirs.generation_config.eos_token_id = None
    generator = torch.Generator(device="cuda").manual_seed(1)
    for batch in s.decode_batches:
        ids = torch.randint(0, gpt2_shapes()["vocab"], (batch, s.prompt), device="cuda", generator=generator)
        tokens = batch * s.new_tokens

        def add(what: str, seconds: float, batch: int = batch, tokens: int = tokens, **extra: object) -> None:
            row = {"what": f"decode {what}, batch {batch}", "tokens_per_s": tokens / seconds,
                   "ms_per_call": 1000 * seconds, **extra}
            rows.append(row)
            notes = "  ".join(f"{k} {v}" for k, v in extra.items())
            print(f"{row['what']:<52} {row['tokens_per_s']:>10,.0f} tokens/s  "
                  f"{row['ms_per_call']:8.1f} ms/call  {notes}", flush=True)

        seconds, eager = timed(lambda ids=ids: seqzoo.generate(ours, ids, s.new_tokens, eos_id=None), s.repeats)
        add("seqzoo eager", seconds)
        torch.cuda.synchronize()
        start = time.perf_counter()
        seqzoo.generate(ours, ids, s.new_tokens, eos_id=None, compile=True)  # compiles this batch size
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - start
        seconds, compiled = timed(lambda ids=ids: seqzoo.generate(ours, ids, s.new_tokens, eos_id=None,
                                                                  compile=True), s.repeats)
        # bf16 rounding differs between the eager and the compiled step, so a near-tie may
        # decode differently: reported, not asserted (tests/test_cuda.py checks float32).
        add("seqzoo compile=True", seconds, first_call_s=round(compile_s, 1),
            same_tokens_as_eager=bool(torch.equal(compiled, eager)))
        if theirs is None:
            continue
        mask = torch.ones_like(ids)
        for what, options in (("transformers generate", {}),
                              ("transformers generate, static cache", {"cache_implementation": "static"})):
            def run(options: dict = options, ids: Tensor = ids, mask: Tensor = mask) -> Tensor:
                with torch.inference_mode():
                    return theirs.generate(ids, attention_mask=mask, max_new_tokens=s.new_tokens,
                                           do_sample=False, pad_token_id=0, **options)
            try:
                seconds, out = timed(run, s.repeats)
            except Exception as error:  # a transformers version without this path: say so, go on
                rows.append({"what": f"decode {what}, batch {batch}", "error": f"{type(error).__name__}: {error}"})
                print(f"{rows[-1]['what']:<52} failed: {rows[-1]['error'][:200]}", flush=True)
                continue
            assert out.shape == (batch, s.prompt + s.new_tokens), f"{what} made {tuple(out.shape)}"
            add(what, seconds)
    return rows


# -- main ------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer steps and tokens: a smoke run")
    parser.add_argument("--batch", type=int, help="training batch (sequences of 1024 tokens)")
    parser.add_argument("--peak-tflops", type=float, default=H200_BF16_PEAK_TFLOPS,
                        help=f"the GPU's dense bf16 peak for MFU (default {H200_BF16_PEAK_TFLOPS:g}, H200 SXM)")
    parser.add_argument("--only", choices=["training", "decoding"], help="run one half")
    parser.add_argument("--no-transformers", action="store_true", help="seqzoo alone")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(f"benchmarks/gpu.py: needs a CUDA GPU, and torch {torch.__version__} sees none "
              f"(torch.cuda.is_available() is False)", file=sys.stderr)
        return 1
    s = QUICK if args.quick else Settings()
    if args.batch:
        s.batch = args.batch
    try:
        import transformers
        hf_version = transformers.__version__
    except ImportError:
        hf_version = None
    with_transformers = hf_version is not None and not args.no_transformers
    shapes = gpt2_shapes()
    ours = seqzoo_gpt2("float32")
    n = matmul_params(ours)
    flops = train_flops_per_token(n, shapes["layers"], shapes["dim"], s.seq)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, seqzoo {seqzoo.__version__}, "
          f"transformers {hf_version or 'not installed'}")
    print(f"settings: {asdict(s)}")
    print(f"MFU = (6·N + 12·L·C·T) × tokens/s / peak, N = {n:,} parameters in matrix products (the "
          f"position table excluded), L = {shapes['layers']}, C = {shapes['dim']}, T = {s.seq}: "
          f"{flops / 1e6:.1f} MFLOP per token; peak {args.peak_tflops:g} TFLOP/s dense bf16")
    results: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "transformers": hf_version,
                     "settings": asdict(s), "peak_tflops": args.peak_tflops, "matmul_params": n,
                     "flops_per_token": flops, "rows": []}
    if args.only in (None, "training"):
        results["rows"].append(bench_training("seqzoo gpt2", ours, s, flops, args.peak_tflops))
        del ours
        release()
        if with_transformers:
            theirs = transformers_gpt2(torch.float32)
            assert matmul_params(theirs) == n, "transformers' GPT-2 has other shapes"
            results["rows"].append(bench_training("transformers GPT2LMHeadModel", theirs, s, flops, args.peak_tflops))
            del theirs
            release()
    else:
        del ours
        release()
    if args.only in (None, "decoding"):
        results["rows"] += bench_decoding(s, with_transformers)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
