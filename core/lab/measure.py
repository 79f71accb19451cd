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

from ..errors import InputError
from ..io.build import build
from ..recipe import resolve


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


def non_embedding_parameters(model: nn.Module) -> int:
    """Parameters without the vocabulary and position tables (Kaplan et al., 2020): every
    ``nn.Embedding``'s weight and an untied LM head (a matrix with a vocabulary-sized dimension
    that is not the embedding's) are left out."""
    tables = {id(m.weight): m.weight for m in model.modules() if isinstance(m, nn.Embedding)}
    vocab = {t.shape[0] for t in tables.values()}
    heads = {id(p) for name, p in model.named_parameters() if p.dim() == 2 and p.shape[0] in vocab
             and name.split(".")[-2:-1] == ["lm_head"] and id(p) not in tables}
    return sum(p.numel() for p in model.parameters() if id(p) not in tables and id(p) not in heads)


def ffn_width_key(model: dict) -> str | None:
    """The recipe key of a model section's FFN width: ``model.ffn.hidden``, or for a mixture of
    experts each expert's (``model.ffn.expert.hidden``); None for a model without an FFN."""
    ffn = model.get("ffn")
    if not isinstance(ffn, dict):
        return None if ffn is None else "model.ffn.hidden"
    if ffn.get("kind") == "moe":
        return "model.ffn.expert.hidden"
    return "model.ffn.hidden" if "hidden" in ffn else None


def match_parameters(recipe, overrides: list[str], target: int, name: str = "", *, least: int = 8) -> list[str]:
    """The override of the FFN width (``ffn_width_key``) that brings a recipe's parameter count
    nearest ``target``: the count is affine in the width, so two builds on the meta device give the
    slope. The experiments and ``seqzoo compare --match-params`` share it."""
    key = ffn_width_key(resolve(recipe, overrides).data["model"])
    if key is None:
        raise InputError(f"--match-params: {name or recipe} has no FFN width to solve (model.ffn: null); give it "
                         f"an FFN, or compare without matching")
    low, high = (parameters(build(recipe, [*overrides, f"{key}={width}"], device="meta"))
                 for width in (least, least + 64))
    per_unit = (high - low) / 64
    width = least if per_unit <= 0 else max(least, round(least + (target - low) / per_unit))
    return [f"{key}={width}"]


def loglog_slope(xs: list[float], ys: list[float]) -> float:
    """The least-squares slope of log y against log x: 1 for y ∝ x, 2 for y ∝ x²."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = statistics.fmean(lx), statistics.fmean(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)
