"""Measurements of this machine that do not change from run to run (the peak FLOP/s MFU is
reported against), made once and cached per machine, device, dtype and thread count.

A figure measured afresh by every process swings with whatever else the machine is doing at that
moment (MFU read 48% in one run and 16.5% in the next at the same tokens per second). Measured
once, at leisure, and kept, it is the same denominator for every run. The cache is a JSON file in
``$SEQZOO_CACHE_DIR`` (default ``$XDG_CACHE_HOME/seqzoo``, else ``~/.cache/seqzoo``); delete it to
measure again. Where it cannot be written, each process measures for itself.
"""
from __future__ import annotations

import json
import os
import platform
from collections.abc import Callable
from pathlib import Path

import torch

from ..files import write_text_atomic

CACHE_FILE = "machine.json"


def cache_dir() -> Path:
    """Where the measurements are kept."""
    if os.environ.get("SEQZOO_CACHE_DIR"):
        return Path(os.environ["SEQZOO_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "seqzoo"


def device_name(device: torch.device) -> str:
    """The model of the processor that ``device`` is: the CPU's model name, or the GPU's."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


#: The environment variables that cap the instructions oneDNN and MKL may use: a capped process
#: multiplies at another rate on the same processor (bfloat16 under ``ONEDNN_MAX_CPU_ISA=AVX2`` ran
#: 85× slower than uncapped on an AMD EPYC with ``avx512_bf16``), so its measurements are its own.
ISA_CAPS = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


def measurement_key(what: str, device: torch.device, dtype: torch.dtype) -> str:
    """``what`` on this processor, in ``dtype``, at this thread count (CPU) under this torch, and
    under the instruction-set caps set in the environment (``ISA_CAPS``), if any."""
    threads = f"threads={torch.get_num_threads()}" if device.type == "cpu" else device.type
    dtype_name = str(dtype).removeprefix("torch.")
    caps = "".join(f" | {name}={os.environ[name]}" for name in ISA_CAPS
                   if device.type == "cpu" and os.environ.get(name))
    return f"{what} | {device_name(device)} | {dtype_name} | {threads} | torch {torch.__version__}{caps}"


def cached(key: str, measure: Callable[[], float]) -> float:
    """The value kept under ``key``, or ``measure()``'s, kept for next time."""
    path = cache_dir() / CACHE_FILE
    try:
        kept = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        kept = {}
    if not isinstance(kept, dict):
        kept = {}
    value = kept.get(key)
    if isinstance(value, (int, float)) and value > 0:
        return float(value)
    value = measure()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps({**kept, key: value}, indent=1, sort_keys=True))
    except OSError:
        pass  # a read-only home: measured again next time, nothing worse
    return value
