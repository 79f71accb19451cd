"""What building, saving and loading a shipped model costs (docs/performance.md, "Checkpoints").

    python benchmarks/checkpoint.py                 # bloom-560m: peak memory, and load with/without checksums
    python benchmarks/checkpoint.py --recipe llama2-7b --no-load

Each measurement runs in a fresh process (its peak RSS is the process's own, ru_maxrss), one at a
time; the load timings alternate between a checkpoint with checksums and the same file without
them, and the medians are reported. Run it alone: anything else on the machine moves the ratio.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

BUILD = """
import json, resource, sys, time
import seqzoo
t = time.perf_counter()
model = seqzoo.build(sys.argv[1])
built = time.perf_counter() - t
seqzoo.save(model, sys.argv[2])
size = sum(p.numel() * p.element_size() for p in model.parameters())
print(json.dumps({"bytes": size, "build_s": built, "total_s": time.perf_counter() - t,
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

LOAD = """
import json, resource, sys, time
import seqzoo
t = time.perf_counter()
seqzoo.load(sys.argv[1])
print(json.dumps({"load_s": time.perf_counter() - t,
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

READS = """
import json, statistics, sys, time
import seqzoo
from seqzoo.io.checkpoint import load_weights
model = seqzoo.load(sys.argv[1])
times = {"checked": [], "plain": []}
for repeat in range(int(sys.argv[3])):
    for name, path in (("checked", sys.argv[1]), ("plain", sys.argv[2]))[:: 1 if repeat % 2 else -1]:
        t = time.perf_counter()
        load_weights(model, path)
        times[name].append(time.perf_counter() - t)
print(json.dumps({name: statistics.median(values) for name, values in times.items()}))
"""

BASELINE = """
import json, resource
import seqzoo, torch
print(json.dumps({"peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def run(code: str, *args: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def without_checksums(source: Path, target: Path) -> None:
    """The same checkpoint with the checksum key removed (as older seqzoo wrote it)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from seqzoo.io.tensorfile import CHECKSUMS

    with safe_open(str(source), framework="pt") as handle:
        metadata = {k: v for k, v in handle.metadata().items() if k != CHECKSUMS}
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    save_file(tensors, str(target), metadata=metadata)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="bloom-560m")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-load", action="store_true", help="measure the build and save only")
    args = parser.parse_args()
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    print(f"{args.recipe} on {cpu}, {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory(dir=os.environ.get("SEQZOO_BENCH_DIR")) as folder:
        checked, plain = Path(folder) / "checked.safetensors", Path(folder) / "plain.safetensors"
        base = run(BASELINE)["peak_mb"]
        built = run(BUILD, args.recipe, str(checked))
        model_mb = built["bytes"] / 2**20
        print(f"build + save: {built['total_s']:.1f} s; peak RSS {built['peak_mb']:.0f} MiB for {model_mb:.0f} MiB of "
              f"weights = {built['peak_mb'] / model_mb:.2f}× (the process without a model: {base:.0f} MiB)")
        if args.no_load:
            return 0
        without_checksums(checked, plain)
        times: dict[str, list[float]] = {"checked": [], "plain": []}
        peaks = []
        for repeat in range(args.repeats):
            pair = [("checked", checked), ("plain", plain)]
            for name, path in pair if repeat % 2 == 0 else pair[::-1]:  # neither always goes first
                result = run(LOAD, str(path))
                times[name].append(result["load_s"])
                peaks.append(result["peak_mb"])
        a, b = statistics.median(times["checked"]), statistics.median(times["plain"])
        print(f"load, median of {args.repeats}: with checksums {a:.3f} s, without {b:.3f} s: {a / b:.3f}× "
              f"({(a / b - 1) * 100:+.1f}%); peak RSS {max(peaks):.0f} MiB = {max(peaks) / model_mb:.2f}×")
        reads = run(READS, str(checked), str(plain), str(args.repeats))
        print(f"reading the weights alone (into a built model), median of {args.repeats}: with checksums "
              f"{reads['checked']:.3f} s, without {reads['plain']:.3f} s: the checks cost "
              f"{reads['checked'] - reads['plain']:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
