"""Which precision a run computes in: ``train.precision`` resolved for the device.

``float32`` and ``bfloat16`` are taken as asked. ``auto`` is bfloat16 autocast on CUDA, and on the
CPU whatever a short probe finds faster: CPUs differ by two orders of magnitude here. An Intel
Xeon with AMX tiles (``amx_bf16``) multiplies bfloat16 matrices ~7× faster than float32 ones, an
AMD EPYC with ``avx512_bf16`` ~2–3× faster, and one without either ~200× slower (oneDNN falls back
to converting every element). And the edge depends on the size: on that EPYC a (512 × 64) @
(64 × 64) product is no faster in bfloat16, a (512 × 256) @ (256 × 256) one 2× faster. So the
probe times float32 and bfloat16 products of the model's own width C, (512 × C) @ (C × C), keeps
both rates per machine, width, thread count and torch (``seqzoo.train.machine``), and picks
bfloat16 only when it is clearly faster: autocast also pays for casts and for the element-wise
work it leaves in float32, so a small edge in matrix products does not make a faster step (the
README's 64-wide tiny-gpt trained 1.5× slower under autocast on that EPYC).

Under autocast only the matrix products run in bfloat16: the weights the optimizer updates, its
state, the loss, norms' statistics and every recurrent state stay float32 (docs/training.md).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .machine import cached, measurement_key

#: bfloat16 products must be this much faster than float32 ones for ``auto`` to pick them.
FASTER = 1.5
#: Rows of the probe's products (a batch of tokens), and the width probed when none is given.
PROBE_ROWS = 512
PROBE_WIDTH = 512
#: The flags that say a CPU multiplies bfloat16 natively (AMX tiles, AVX-512 BF16 dot products).
BF16_FLAGS = ("amx_bf16", "amx_tile", "avx512_bf16")


@dataclass(frozen=True)
class Precision:
    """A run's precision: ``dtype_name`` (float32 | bfloat16) of its matrix products, whether that
    is autocast, ``reason`` (asked, CUDA, or the probe's verdict) and, on the CPU under ``auto``,
    the probe's two ``rates`` in FLOP/s."""

    dtype_name: str
    reason: str
    rates: dict[str, float] | None = None

    @property
    def autocast(self) -> bool:
        return self.dtype_name == "bfloat16"

    def record(self) -> dict:
        """What train and compare write down about it."""
        return {"precision": self.dtype_name, "reason": self.reason,
                **({"probe_flops": self.rates} if self.rates else {})}

    def describe(self) -> str:
        """``bfloat16 autocast (auto: bfloat16 products 2.9x float32's, at least 1.5x (190 vs 65 GFLOP/s))``."""
        name = "bfloat16 autocast" if self.autocast else "float32"
        return f"{name} ({self.reason})"


def resolve(asked: str, device: torch.device, width: int = PROBE_WIDTH) -> Precision:
    """``train.precision`` (auto | float32 | bfloat16) on ``device``, for a model ``width`` wide."""
    if asked != "auto":
        return Precision(asked, f"train.precision={asked}")
    if device.type == "cuda":
        return Precision("bfloat16", "auto: bfloat16 autocast on CUDA")
    if device.type != "cpu":
        return Precision("float32", f"auto: float32 on {device.type}")
    return probe(device, width)


def autocast_for(precision: Precision, device: torch.device):
    """The forward's autocast context: bfloat16 where ``precision`` says so, else none (the
    backward runs outside it)."""
    if precision.autocast:
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return torch.autocast(device.type, enabled=False)


def probe(device: torch.device, width: int = PROBE_WIDTH) -> Precision:
    """``auto``'s choice on the CPU for a model ``width`` wide, by the two measured rates (cached
    after the first run)."""
    rates = {name: cached(measurement_key(f"probe FLOP/s {PROBE_ROWS}x{width}", device, dtype),
                          lambda dtype=dtype: _rate(dtype, width))
             for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16))}
    ratio = rates["bfloat16"] / rates["float32"]
    verdict = "bfloat16" if ratio >= FASTER else "float32"
    how = "at least" if verdict == "bfloat16" else "under"
    reason = (f"auto: bfloat16 products {ratio:.2g}x float32's, {how} {FASTER}x "
              f"({rates['bfloat16'] / 1e9:.0f} vs {rates['float32'] / 1e9:.0f} GFLOP/s)")
    return Precision(verdict, reason, rates)


def _rate(dtype: torch.dtype, width: int, budget: float = 0.3) -> float:
    """The best FLOP/s of (512 × width) @ (width × width) in ``dtype`` on the CPU: as many tries as fit in
    ``budget`` seconds, two where a product alone takes longer (a CPU slow at the dtype; the first
    try also sets up oneDNN's kernel)."""
    a = torch.randn(PROBE_ROWS, width, dtype=dtype)
    b = torch.randn(width, width, dtype=dtype)
    best, spent, tries = float("inf"), 0.0, 0
    while tries < 2 or (tries < 50 and spent < budget):
        start = time.perf_counter()
        a @ b
        took = time.perf_counter() - start
        best, spent, tries = min(best, took), spent + took, tries + 1
    return 2 * PROBE_ROWS * width * width / best


def model_width(model: torch.nn.Module) -> int:
    """The width the probe measures for ``model``: its token embedding's (C), else its widest
    linear layer's input, else ``PROBE_WIDTH``."""
    for module in model.modules():
        if isinstance(module, torch.nn.Embedding):
            return module.embedding_dim
    widths = [m.in_features for m in model.modules() if isinstance(m, torch.nn.Linear)]
    return max(widths, default=PROBE_WIDTH)


def cpu_flags() -> list[str]:
    """The bfloat16 flags of this CPU (``BF16_FLAGS``) that /proc/cpuinfo lists, for the record."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    for line in text.splitlines():
        if line.startswith("flags"):
            present = set(line.split(":", 1)[1].split())
            return [flag for flag in BF16_FLAGS if flag in present]
    return []
