"""The benchmark scripts run (their numbers live in docs/performance.md, not in tests)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.slow  # a minute or more of the suite's ten: the benchmark scripts' smoke runs
def test_run_quick_prints_every_comparison(tmp_path):
    out = subprocess.run([sys.executable, str(BENCHMARKS / "run.py"), "--quick", "--json", str(tmp_path / "b.json")],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = json.loads((tmp_path / "b.json").read_text())["rows"]
    names = [row["what"] for row in rows]
    assert any(n.startswith("train step, GPT-2") for n in names)
    assert any(n.startswith("train step, LLaMA") for n in names)
    assert sum(n.startswith("greedy generate") for n in names) == 4
    assert sum(n.startswith("eager generate") for n in names) == 4
    assert any(n.startswith("additive score peak memory") for n in names)
    assert any(n == "import time" for n in names)
    mamba = next(row for row in rows if row["what"].startswith("Mamba train step"))
    assert set(mamba["vs"]) == {"transformers (sequential)", "mambapy scan"}
    assert sum(n.startswith("Mamba train step") and n.endswith("(recall shape)") for n in names) == 1
    assert sum(n.startswith(("Mamba decode", "attention decode")) for n in names) == 2
    assert any("prefill peak memory" in n for n in names)
    moe = next(row for row in rows if row["what"].startswith("MoE train step"))
    assert set(moe["vs"]) == {"transformers Mixtral"}
    assert sum(n.startswith("MoE greedy generate") for n in names) == 2
    decoding = [row for row in rows if " greedy generate, batch " in row["what"] and not row["what"].startswith("MoE")]
    assert [row["what"].split(" greedy")[0] for row in decoding] == [
        "Mixtral MoE", "Mixtral MoE", "Mamba", "Mamba-2", "hybrid (Bamba)", "MLA (DeepSeek-V3)"]
    assert set(decoding[0]["vs"]) == {"transformers", "transformers static"}
    flex_rows = [row for row in rows if row["what"].endswith((", flex", ", blockwise"))]
    assert len(flex_rows) == 8 and all({"materialised", "causal SDPA layer"} == set(r["vs"]) for r in flex_rows)
    mla = next(row for row in rows if row["what"].startswith("MLA KV cache bytes"))
    assert set(mla["vs"]) == {"MHA", "GQA"} and mla["vs"]["MHA"]["ratio"] > mla["vs"]["GQA"]["ratio"] > 1
    gpt2 = next(row for row in rows if row["what"] == "train step, GPT-2 shape")
    assert {"transformers", "reference"} <= set(gpt2["vs"]) and gpt2["gflops"]["matmul"] > 0
    seams = next(row for row in rows if row["what"] == "train step, GPT-2, same math as reference")
    assert set(seams["vs"]) == {"reference"}


def test_optimizer_benchmark_runs(tmp_path):
    out = subprocess.run([sys.executable, str(BENCHMARKS / "optimizers.py"), "--rounds", "1", "--warmup", "0",
                          "--batch", "2", "--seq-len", "16", "--set", "model.layers=1",
                          "--json", str(tmp_path / "o.json")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads((tmp_path / "o.json").read_text())
    assert set(result["medians"]) == {"adamw", "muon"} and result["step_ratio"] > 0
    assert "Muon's whole step / AdamW's" in out.stdout


def test_precision_benchmark_runs_and_records_the_instruction_set_caps(tmp_path):
    import os

    out = subprocess.run([sys.executable, str(BENCHMARKS / "precision.py"), "--rounds", "1", "--warmup", "0",
                          "--batch", "2", "--seq-len", "16", "--set", "model.layers=1", "--set", "model.dim=64",
                          "--set", "model.attention.heads=2", "--set", "model.attention.kv_heads=1",
                          "--set", "model.ffn.hidden=128", "--json", str(tmp_path / "p.json")],
                         capture_output=True, text=True, timeout=300,
                         env={**{k: v for k, v in os.environ.items() if "ISA" not in k},
                              "SEQZOO_CACHE_DIR": str(tmp_path), "MKL_ENABLE_INSTRUCTIONS": "AVX2"})
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads((tmp_path / "p.json").read_text())
    assert set(result["medians"]) == {"float32", "bfloat16"} and result["probe"]["auto"] in ("float32", "bfloat16")
    assert result["caps"] == {"MKL_ENABLE_INSTRUCTIONS": "AVX2"}
    assert "capped at MKL_ENABLE_INSTRUCTIONS=AVX2" in out.stdout


@pytest.mark.slow  # a minute or more of the suite's ten: the benchmark scripts' smoke runs
def test_startup_benchmark_runs(tmp_path):
    out = subprocess.run([sys.executable, str(BENCHMARKS / "startup.py"), "--runs", "1", "--no-example"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "seqzoo --help" in out.stdout


# -- benchmarks/gpu.py: its numbers need a GPU; here, its CPU behaviour and its FLOP count ---------
def _gpu_benchmark():
    """benchmarks/gpu.py as a module (benchmarks/ is not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("seqzoo_gpu_benchmark", BENCHMARKS / "gpu.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def _no_cuda_env() -> dict[str, str]:
    import os

    return {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no GPU even on a machine that has one


def test_gpu_benchmark_without_cuda_says_so_in_one_line():
    out = subprocess.run([sys.executable, str(BENCHMARKS / "gpu.py"), "--quick"], capture_output=True, text=True,
                         timeout=300, env=_no_cuda_env())
    assert out.returncode == 1 and out.stdout == ""
    said = [line for line in out.stderr.splitlines() if "gpu.py" in line]
    assert len(said) == 1 and "needs a CUDA GPU" in said[0] and "Traceback" not in out.stderr


def test_gpu_check_without_cuda_stops_before_the_tests(tmp_path):
    out = subprocess.run(["bash", str(BENCHMARKS / "gpu_check.sh"), str(tmp_path)], capture_output=True, text=True,
                         timeout=300, env={**_no_cuda_env(), "PYTHON": sys.executable})
    assert out.returncode == 1
    assert "needs a CUDA device" in (tmp_path / "summary.txt").read_text()
    assert not (tmp_path / "cuda_tests.txt").exists()


def test_gpu_benchmark_flop_count():
    import pytest

    import seqzoo

    gpu = _gpu_benchmark()
    assert gpu.train_flops_per_token(1000, 2, 8, 16) == 6 * 1000 + 12 * 2 * 8 * 16 == 9072
    # 1000 tokens/s × 9072 FLOP = 9.072e6 FLOP/s: all of a 9.072e6 FLOP/s peak, half of twice that
    assert gpu.mfu(1000, 9072, 9.072e-6) == pytest.approx(1.0)
    assert gpu.mfu(1000, 9072, 2 * 9.072e-6) == pytest.approx(0.5)
    # N leaves out the looked-up tables only: tiny-gpt's 256 × 64 position table; its token table
    # counts once, as the tied LM head, and is left out when the head is a matrix of its own.
    tied = seqzoo.build("tiny-gpt", device="meta")
    untied = seqzoo.build("tiny-gpt", ["model.tie_embeddings=false"], device="meta")
    assert gpu.matmul_params(tied) == sum(p.numel() for p in tied.parameters()) - 256 * 64
    assert gpu.matmul_params(untied) == sum(p.numel() for p in untied.parameters()) - 256 * 64 - 259 * 64
    # GPT-2 small: nanoGPT's 123.65M non-embedding parameters, 855 MFLOP per token at T = 1024
    gpt2 = seqzoo.build("gpt2", device="meta")
    assert gpu.matmul_params(gpt2) == 124_439_808 - 1024 * 768 == 123_653_376
    assert gpu.train_flops_per_token(123_653_376, 12, 768, 1024) == 855_166_464
    assert gpu.gpt2_shapes() == {"vocab": 50257, "dim": 768, "layers": 12, "heads": 12, "positions": 1024,
                                 "hidden": 3072}


@pytest.mark.slow  # a minute or more of the suite's ten: the benchmark scripts' smoke runs
def test_data_benchmark_quick_runs(tmp_path):
    out = subprocess.run([sys.executable, str(BENCHMARKS / "data.py"), "--quick", "--json", str(tmp_path / "d.json")],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    results = json.loads((tmp_path / "d.json").read_text())
    assert results["prepare_bytes"]["mb_per_s"] > 0 and results["prepare_bpe"]["mb"] > 0
    assert 0 < results["batch"]["share"] < 1 and results["prepare_big"]["peak_rss_mb"] > 0


def test_nanogpt_benchmark_quick_trains_both_alike(tmp_path, grammar_shards):
    out = subprocess.run([sys.executable, str(BENCHMARKS / "nanogpt.py"), "--data", grammar_shards, "--quick",
                          "--steps", "6", "--eval-every", "3", "--log-every", "2", "--eval-rows", "4",
                          "--json", str(tmp_path / "n.json")], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    results = json.loads((tmp_path / "n.json").read_text())
    assert [p["step"] for p in results["points"]] == [3, 6]
    assert results["worst_relative"] < 1e-4  # the same weights, rows and learning rates: the same losses
    assert results["seqzoo_tokens_per_s"] > 0 and results["nanogpt_tokens_per_s"] > 0


@pytest.mark.slow
def test_mixer_benchmark_prints_its_table_and_the_delta_rules_loop(tmp_path):
    out = subprocess.run([sys.executable, str(BENCHMARKS / "mixers.py"), "--only", "attention,gated_deltanet",
                          "--length", "64", "--batch", "1", "--repeats", "1", "--memory-lengths", "64,128"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if line.startswith("| attention") or
            line.startswith("| gated_deltanet")]
    assert len(rows) == 2, out.stdout
    assert "gated delta rule, forward + backward, batch 1, T 64" in out.stdout
