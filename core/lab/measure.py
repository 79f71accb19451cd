"""Measurements the experiments and benchmarks share: CPU peak memory, median times, cached decode
time per token, and models of a given parameter count (an FFN width solved for it).

Timings here are medians of repeated runs, so one slow repetition (another process, a page fault)
does not move them; compare ratios of runs taken side by side, not numbers from different days.
"""
from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn


def parameters(model: nn.Module) -> int:
    """The number of parameters, each shared tensor counted once (a tied head is the embedding)."""
    return sum(p.numel() for p in model.parameters())


def peak_memory_mb(fn: Callable[[], object]) -> float:
    """Peak MiB held by CPU tensors allocated while ``fn`` runs, above what was held before.

    Read from the torch profiler's memory events. Each op's *self* allocation is counted (what it
    allocated minus what it freed, its children excluded: an op's total would count its children's
    tensors again), and the profiler's ``[memory]`` records give the frees that happen between ops.
    Summed in time order, they give the live bytes after every op; the result is their maximum.
    Temporaries freed inside one op are not seen, so this is a lower bound by at most one op's
    scratch space.
    """
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e for e in prof.events() if e.self_cpu_memory_usage), key=lambda e: e.time_range.start)
    live = peak = 0
    for event in events:
        live += event.self_cpu_memory_usage
        peak = max(peak, live)
    return peak / 2 ** 20


def median_ms(fn: Callable[[], object], repeats: int, warmup: int = 1) -> float:
    """The median wall time of ``fn`` in milliseconds over ``repeats`` runs after ``warmup``."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def decode_ms_per_token(model: nn.Module, context: int, vocab: int, steps: int = 32) -> float:
    """Median milliseconds of one cached greedy decode step (batch 1) after a prompt of ``context``
    tokens: the model's own cache (a KV cache, or a fixed-size state), logits of the last token."""
    ids = torch.randint(3, vocab, (1, context + steps), generator=torch.Generator().manual_seed(2))
    times = []
    with torch.no_grad():
        cache = model.new_cache(1, context + steps)
        model(ids[:, :context], cache=cache, logits_to_keep=1)
        for t in range(context, context + steps):
            start = time.perf_counter()
            model(ids[:, t:t + 1], cache=cache, logits_to_keep=1)
            times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def with_parameter_count(build: Callable[..., nn.Module], target: int, *, least: int = 8) -> nn.Module:
    """``build(hidden, device=...)`` with the FFN width ``hidden`` ≥ ``least`` that brings its
    parameter count nearest ``target``. The count is affine in the width (each layer's FFN adds a fixed number of
    parameters per unit), so two builds on the meta device give the slope; the model returned is
    then built for real."""
    low, high = (parameters(build(width, device="meta")) for width in (least, least + 64))
    per_unit = (high - low) / 64
    hidden = least if per_unit <= 0 else max(least, round(least + (target - low) / per_unit))
    return build(hidden)


def loglog_slope(xs: list[float], ys: list[float]) -> float:
    """The least-squares slope of log y against log x: 1 for y ∝ x, 2 for y ∝ x²."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = statistics.fmean(lx), statistics.fmean(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)
