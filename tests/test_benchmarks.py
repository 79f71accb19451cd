"""The benchmark scripts run (their numbers live in docs/performance.md, not in tests)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


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
    gpt2 = next(row for row in rows if row["what"] == "train step, GPT-2 shape")
    assert {"transformers", "reference"} <= set(gpt2["vs"]) and gpt2["gflops"]["matmul"] > 0
    seams = next(row for row in rows if row["what"] == "train step, GPT-2, same math as reference")
    assert set(seams["vs"]) == {"reference"}


def test_startup_benchmark_runs(tmp_path):
    out = subprocess.run([sys.executable, str(BENCHMARKS / "startup.py"), "--runs", "1", "--no-example"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "seqzoo --help" in out.stdout
