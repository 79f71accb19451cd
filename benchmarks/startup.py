"""Start-up time of the seqzoo CLI against the floor it cannot beat, ``python -c "import torch"``.

    python benchmarks/startup.py             # 15 interleaved rounds, example plugin installed
    python benchmarks/startup.py --runs 30 --no-example --check

Each round runs every command once, in turn (interleaving spreads machine noise over all of them),
in a fresh process; the report gives the median wall time of each and its ratio to ``import torch``.
The example plugin package (examples/seqzoo-example-plugin) is installed into a temp folder with
``pip install --no-deps --target`` and put on PYTHONPATH for every command, torch's included, so
``seqzoo list`` pays for entry-point discovery and the plugin's import. Target: both ratios ≤ 1.3.
``--check`` exits 1 when a ratio is above the target.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "seqzoo-example-plugin"
TARGET = 1.3


def seqzoo_command() -> list[str]:
    """The installed console script itself (not a pyenv/asdf shim, which adds its own start-up)."""
    script = Path(sysconfig.get_path("scripts")) / ("seqzoo.exe" if os.name == "nt" else "seqzoo")
    return [str(script)] if script.exists() else [sys.executable, "-m", "seqzoo"]


def install_example(folder: Path) -> Path:
    source = folder / "src"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    "--no-build-isolation", "--disable-pip-version-check", "--target", str(folder / "site"),
                    str(source)], check=True, env={**os.environ, "PIP_ROOT_USER_ACTION": "ignore"})
    return folder / "site"


def time_once(command: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="interleaved rounds (15)")
    parser.add_argument("--no-example", action="store_true", help="do not install the example plugin")
    parser.add_argument("--check", action="store_true", help=f"exit 1 if a ratio exceeds {TARGET}")
    args = parser.parse_args()

    env = {k: v for k, v in os.environ.items() if not k.startswith("SEQZOO_")}
    with tempfile.TemporaryDirectory() as tmp:
        if not args.no_example:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(install_example(Path(tmp))),
                                                              env.get("PYTHONPATH")]))
        seqzoo = seqzoo_command()
        commands = {
            'python -c "import torch"': [sys.executable, "-c", "import torch"],
            "seqzoo --help": [*seqzoo, "--help"],
            "seqzoo list": [*seqzoo, "list"],
        }
        listed = subprocess.run(commands["seqzoo list"], env=env, capture_output=True, text=True, check=True)
        if not args.no_example and "seqzoo-example-plugin" not in listed.stdout:
            print("the example plugin was not discovered; is seqzoo installed?", file=sys.stderr)
            return 2
        for command in commands.values():  # warm the file cache before timing anything
            time_once(command, env)
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.runs):
            for name, command in commands.items():
                times[name].append(time_once(command, env))

    base = statistics.median(times['python -c "import torch"'])
    print(f"{'command':<28} {'median s':>9} {'min s':>7} {'ratio':>6}   ({args.runs} interleaved rounds, "
          f"example plugin {'not ' if args.no_example else ''}installed)")
    worst = 0.0
    for name, samples in times.items():
        median = statistics.median(samples)
        ratio = median / base
        if name != 'python -c "import torch"':
            worst = max(worst, ratio)
        print(f"{name:<28} {median:>9.3f} {min(samples):>7.3f} {ratio:>6.2f}")
    verdict = "within" if worst <= TARGET else "ABOVE"
    print(f"worst ratio {worst:.2f}: {verdict} the {TARGET}x target")
    return 1 if args.check and worst > TARGET else 0


if __name__ == "__main__":
    sys.exit(main())
