"""The data layer's speed and memory: reading a batch of windows against a training step, `seqzoo data
prepare` in MB/s with the bytes tokenizer and with a BPE tokenizer.json, and the peak resident
memory of preparing a corpus of about 2 GB (it streams: no corpus is held in memory).

    python benchmarks/data.py                       # all three (a few minutes, about 6 GB of disk)
    python benchmarks/data.py --quick               # small sizes, a smoke test
    python benchmarks/data.py --corpus DIR --glob '*.py'

The corpus defaults to the running interpreter's standard library (``Lib/**/*.py``, without
site-packages); the 2 GB corpus is that many copies of it, in files. Run it alone on the machine:
prepare uses every core.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import torch

import seqzoo
from seqzoo.io.build import instantiate
from seqzoo.lab.compare_results import machine
from seqzoo.recipe import resolve

RECIPE = Path(__file__).resolve().parents[1] / "examples" / "compare" / "gpt2.yaml"


def stdlib() -> str:
    return sysconfig.get_paths()["stdlib"]


MEASURED = """
import json, resource, sys
from seqzoo.cli import main
code = main(sys.argv[1:])
# VmHWM is this program's own peak: ru_maxrss would carry the peak of the process it was forked from.
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
peak = int(status["VmHWM"].split()[0]) if "VmHWM" in status else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"code": code, "self": peak, "workers": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
"""


def prepare(sources: list[str], output: Path, *extra: str) -> dict:
    """``seqzoo data prepare`` in a child process of its own -> the throughput it reports (the time
    it took, without the interpreter's start-up) and the peak resident memory (MiB) of the
    preparing process and of its largest tokenizer worker."""
    run = subprocess.run([sys.executable, "-c", MEASURED, "data", "prepare", *sources, "-o", str(output), "--quiet",
                          *extra], capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(run.stderr)
    lines = run.stdout.strip().splitlines()
    usage = json.loads(lines[-1])
    seconds = float(re.search(r"of text in ([0-9.]+) s", run.stdout).group(1))
    manifest = json.loads((output / "manifest.json").read_text())
    text = sum(split["text_bytes"] for split in manifest["splits"].values())
    return {"mb": text / 1e6, "seconds": seconds, "mb_per_s": text / 1e6 / max(seconds, 1e-9),
            "peak_rss_mb": usage["self"] / 1024, "worker_peak_rss_mb": usage["workers"] / 1024}


def batch_share(data: Path, steps: int) -> dict:
    """Median time to read one training batch (16 windows of 256) against one training step of the
    GPT-2 recipe of docs/compare.md (3.3M parameters), both in this process."""
    resolved = resolve(str(RECIPE), [f"train.task.path={json.dumps(str(data))}"])
    model = instantiate(resolved, device="cpu")
    task = seqzoo.registry().create("task", resolved.data["train"]["task"])
    task.bind(seqzoo.tokenizer(model), 259, 0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    reads, trains = [], []
    for step in range(steps):
        start = time.perf_counter()
        batch = task.batch(step * 16, 16)
        reads.append(time.perf_counter() - start)
        start = time.perf_counter()
        model(batch["ids"], targets=batch["labels"]).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        trains.append(time.perf_counter() - start)
    read, step_time = statistics.median(reads[1:]), statistics.median(trains[1:])
    return {"read_ms": read * 1e3, "step_ms": step_time * 1e3, "share": read / step_time}


def big_corpus(folder: Path, source: Path, gigabytes: float, glob: str) -> None:
    """Copies of ``source``'s files matching ``glob`` until the folder holds ``gigabytes``."""
    files = sorted(p for p in source.rglob(glob) if "site-packages" not in p.parts and p.is_file())
    total, copy = 0, 0
    while total < gigabytes * 1e9:
        for path in files:
            target = folder / f"copy{copy:03d}" / path.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
            total += path.stat().st_size
        copy += 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default=stdlib(), help="a folder of text (default: the standard library)")
    parser.add_argument("--glob", default="*.py")
    parser.add_argument("--gigabytes", type=float, default=2.0, help="size of the corpus for peak memory (2)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--work", help="a scratch folder (default: a temporary one, removed after)")
    parser.add_argument("--parts", default="bytes,bpe,batch,big",
                        help="which measurements, comma-separated: bytes, bpe, batch, big (all)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    parts = set(args.parts.split(","))
    if args.quick and args.corpus == stdlib():
        args.corpus = os.path.join(stdlib(), "email")  # a few hundred kilobytes: seconds, not minutes
    work = Path(args.work or tempfile.mkdtemp(prefix="seqzoo-data-bench-"))
    exclude = ["--glob", args.glob, "--exclude", "site-packages"]
    results = {"machine": machine()}
    try:
        if parts & {"bytes", "batch"}:
            results["prepare_bytes"] = prepare([args.corpus], work / "bytes", *exclude)
            r = results["prepare_bytes"]
            print(f"prepare, bytes: {r['mb']:.1f} MB at {r['mb_per_s']:.1f} MB/s (target >= 50)")
        if "bpe" in parts:
            tokenizer = work / "bpe.json"
            subprocess.run([sys.executable, "-m", "seqzoo", "data", "tokenizer", args.corpus, *exclude, "--vocab",
                            "4096", "-o", str(tokenizer)], check=True, capture_output=True)
            results["prepare_bpe"] = r = prepare([args.corpus], work / "bpe", *exclude, "--tokenizer", str(tokenizer))
            print(f"prepare, BPE 4096: {r['mb']:.1f} MB at {r['mb_per_s']:.1f} MB/s (target >= 5)")
        if "batch" in parts:
            results["batch"] = r = batch_share(work / "bytes", 20 if args.quick else 60)
            print(f"reading a batch: {r['read_ms']:.3f} ms against a {r['step_ms']:.0f} ms training step: "
                  f"{100 * r['share']:.2f}% (target < 2%)")
        if "big" in parts:
            big_corpus(work / "big", Path(args.corpus), 0.05 if args.quick else args.gigabytes, args.glob)
            results["prepare_big"] = r = prepare([str(work / "big")], work / "big-out", "--glob", args.glob)
            print(f"prepare, {r['mb'] / 1e3:.2f} GB: peak RSS {r['peak_rss_mb']:.0f} MiB (target < 500; largest "
                  f"worker {r['worker_peak_rss_mb']:.0f} MiB), {r['mb_per_s']:.1f} MB/s")
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"[{results['machine']['cpu']}, {os.cpu_count()} cores, torch {torch.__version__}]")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
