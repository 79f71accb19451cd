"""What training reports besides the loss: FLOPs per token, model FLOPs utilisation (MFU), peak
memory, and the metrics files — JSON lines always, TensorBoard event files when it is installed.

FLOPs per token are counted on the model itself: one forward pass of a row is run under
``torch.utils.flop_counter.FlopCounterMode`` and its matrix-multiply FLOPs (projections, the
attention products, convolutions, scans written as products) are tripled for forward + backward,
PaLM's and nanoGPT's convention (the backward pass does two products per forward one). Attention
is counted over every key, causal or not, as those conventions do. MFU is the training
throughput in FLOP/s over the device's peak: given (``train.peak_flops``) or measured here as the
best of a few large matrix products in the model's dtype.
"""
from __future__ import annotations

import json
import resource
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from .machine import cached, measurement_key


def _sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """Forward FLOPs of scaled dot-product attention: q·kᵀ and p·v, 2·B·H·T·S·D each."""
    b, h, t, d = query_shape
    s = key_shape[-2]
    return 2 * b * h * t * s * d + 2 * b * h * t * s * value_shape[-1]


def _cpu_attention_formulas() -> dict:
    """FlopCounterMode knows the CUDA attention kernels, not the CPU one: count it the same way."""
    op = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if op is None:
        return {}

    def formula(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
        return _sdpa_flops(query_shape, key_shape, value_shape)

    return {op: formula}


def flops_per_token(loss: Callable[[dict[str, Tensor]], Tensor], tokens: Callable[[dict[str, Tensor]], Tensor],
                    batch: dict[str, Tensor]) -> float:
    """FLOPs per trained token: ``loss``'s forward FLOPs on the first row of ``batch``, times 3,
    over the row's ``tokens`` (those with a label, as tokens/s counts them). Runs under no_grad,
    so it changes no gradient; the caller keeps dropout and random state out of it."""
    from torch.utils.flop_counter import FlopCounterMode

    row = {k: v[:1] for k, v in batch.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # FlopCounterMode warns about ops it has no formula for
        with torch.no_grad(), FlopCounterMode(display=False, custom_mapping=_cpu_attention_formulas()) as counter:
            loss(row)
    return 3 * counter.get_total_flops() / max(int(tokens(row)), 1)


def peak_flops(device: torch.device, dtype: torch.dtype) -> float:
    """The device's peak FLOP/s in ``dtype``: the best of many large matrix products (1024² on the
    CPU at the current thread count, 8192² on CUDA), measured once per machine and kept
    (``seqzoo.train.machine``), so every run's MFU has the same denominator."""
    return cached(measurement_key("peak FLOP/s", device, dtype), lambda: _measure_peak(device, dtype))


def _measure_peak(device: torch.device, dtype: torch.dtype) -> float:
    n = 8192 if device.type == "cuda" else 1024
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best, spent, tries = float("inf"), 0.0, 0
    while tries < 3 or (tries < 30 and spent < 2.0):  # a few tries at least, about 2 s at most
        _synchronize(device)
        start = time.perf_counter()
        a @ b
        _synchronize(device)
        took = time.perf_counter() - start
        best, spent, tries = min(best, took), spent + took, tries + 1
    return 2 * n ** 3 / best


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory_mb(device: torch.device) -> float:
    """The peak memory so far: CUDA's allocated tensors on a GPU; on the CPU the process's peak
    resident set (it includes the interpreter, torch and the mapped data, not tensors alone)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2 ** 20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2 ** 20 if sys.platform == "darwin" else peak / 2 ** 10  # bytes on macOS, KiB elsewhere


class MetricsLog:
    """Every history entry as a JSON line (``jsonl``), and as TensorBoard scalars in ``log_dir``
    when tensorboard is installed. A resumed run first drops the lines past the step it resumes
    from (written by a run that went on after that save), so no step appears twice."""

    def __init__(self, jsonl: Path | None, log_dir: Path | None, resume_step: int | None,
                 notice: Callable[[str], None]) -> None:
        self.jsonl, self.writer = jsonl, None
        if jsonl is not None:
            jsonl.parent.mkdir(parents=True, exist_ok=True)
            kept = []
            if resume_step is not None and jsonl.exists():
                for line in jsonl.read_text(encoding="utf-8").splitlines():
                    try:
                        if json.loads(line).get("step", 0) <= resume_step:
                            kept.append(line)
                    except json.JSONDecodeError:
                        break  # a line cut short by a crash: what follows it is gone too
            jsonl.write_text("".join(f"{line}\n" for line in kept), encoding="utf-8")
        if log_dir is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                notice(f"no TensorBoard event files in {log_dir}: tensorboard is not installed "
                       f"(pip install tensorboard); the metrics are in {jsonl}")
            else:
                self.writer = SummaryWriter(str(log_dir), purge_step=resume_step + 1 if resume_step else None)

    def log(self, entry: dict) -> None:
        if self.jsonl is not None:
            with open(self.jsonl, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(entry) + "\n")
        if self.writer is not None:
            step = entry["step"]
            for key in ("loss", "lr", "tokens_per_s", "mfu", "peak_memory_mb"):
                if key in entry:
                    self.writer.add_scalar(f"train/{key}", entry[key], step)
            for key, value in entry.get("eval", {}).items():
                if isinstance(value, (int, float)):
                    self.writer.add_scalar(f"eval/{key}", value, step)
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
