"""``seqzoo experiment linear-time``: do state-space and linear-recurrent mixers cost time and memory
linear in the sequence length, where self-attention's grow quadratically?

Seven decoders of the same shape and about the same parameter count differ only in their token
mixer: softmax attention (RoPE, SDPA), Mamba, Mamba-2, linear attention (elu + 1), and three of the
hybrid era's: gated DeltaNet, LFM2's gated short convolution and Griffin's RG-LRU. Each layer
has a SwiGLU FFN whose width is solved so every model has the attention model's parameter count.
For each sequence length T, one training step's forward + backward (batch 1, the fused loss) is
timed and its peak memory read; the models take turns at each T so a slow spell of the machine
falls on all of them. Cached greedy decoding is timed per token after contexts of 128 and 4096
tokens: attention reads a KV cache that grows with the context, the others a fixed-size state.

The log–log slope of time against T is fitted over all lengths and over the long half
(T ≥ 2048), where attention's T² term outgrows its projections: at short T every model is
dominated by its O(T) matmuls, so a slope over the whole range understates attention's order.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from ..io.build import build
from .measure import decode_ms_per_token, loglog_slope, match_parameters, median_ms, parameters, peak_memory_mb
from .result import ExperimentResult

#: Each model's overrides of the shared base (below); the FFN width is solved per model.
MIXERS: dict[str, list[str]] = {
    "attention": [],
    "mamba": ["model.mixer={kind: mamba, state: 16, expand: 2}", "model.position=none"],
    "mamba2": ["model.mixer={kind: mamba2, state: 16, head_dim: 32, expand: 2}", "model.position=none"],
    "linear attention": ["model.mixer={kind: linear_attention, heads: 4, feature_map: elu}", "model.position=none"],
    "gated deltanet": ["model.mixer={kind: gated_deltanet, heads: 4}", "model.position=none"],
    "short conv": ["model.mixer={kind: short_conv, conv: 3}", "model.position=none"],
    "rg-lru": ["model.mixer={kind: rg_lru, heads: 4}", "model.position=none"],
}
FULL = {"dim": 128, "layers": 2, "hidden": 344, "lengths": [256, 512, 1024, 2048, 4096, 8192, 16384],
        "contexts": [128, 4096], "long_from": 2048}
QUICK = {"dim": 32, "layers": 2, "hidden": 88, "lengths": [64, 128, 256], "contexts": [16, 64], "long_from": 128}


def models(shape: dict) -> dict[str, torch.nn.Module]:
    """The models, each at the attention model's parameter count (its FFN width solved)."""
    longest = max(shape["lengths"] + shape["contexts"]) + 64

    base = [f"model.dim={shape['dim']}", f"model.layers={shape['layers']}", "model.attention.heads=4",
            "model.attention.kv_heads=4", "model.position.scaling=null", f"model.max_seq_len={longest}",
            "model.tie_embeddings=true", f"model.ffn.hidden={shape['hidden']}"]
    target = parameters(build("tiny-llama", base, device="meta"))
    out = {}
    for name, extra in MIXERS.items():
        overrides = [*base, *extra]
        width = match_parameters("tiny-llama", overrides, target, name) if extra else []
        torch.manual_seed(0)
        out[name] = build("tiny-llama", [*overrides, *width], device="cpu", dtype="float32")
    return out


def training_step(model: torch.nn.Module, ids: torch.Tensor) -> Callable[[], None]:
    """Forward + backward of the next-token loss on ``ids`` (1, T + 1); gradients are dropped."""
    def step() -> None:
        model.zero_grad(set_to_none=True)
        model(ids[:, :-1], targets=ids[:, 1:]).backward()
    return step


def linear_time(quick: bool = False, log: Callable[[str], None] = print) -> ExperimentResult:
    """Time and memory of a training step against T, decode time per token at two contexts."""
    shape = QUICK if quick else FULL
    built = models(shape)
    names, lengths = list(built), shape["lengths"]
    times = {name: [] for name in names}
    memory = {name: [] for name in names}
    for length in lengths:
        ids = torch.randint(3, 259, (1, length + 1), generator=torch.Generator().manual_seed(length))
        repeats = 1 if quick else (3 if length <= 4096 else 2)
        for name in names:  # the models take turns at each length
            step = training_step(built[name].train(), ids)
            times[name].append(median_ms(step, repeats, warmup=1 if length <= 2048 else 0))
            memory[name].append(peak_memory_mb(step))
            log(f"T={length:>6} {name:<17} {times[name][-1]:9.1f} ms  {memory[name][-1]:8.1f} MiB")
    decode = {name: [decode_ms_per_token(built[name].eval(), c, 259) for c in shape["contexts"]] for name in names}
    long = [i for i, n in enumerate(lengths) if n >= shape["long_from"]]
    rows = []
    for name in names:
        slope_all = loglog_slope(lengths, times[name])
        slope_long = loglog_slope([lengths[i] for i in long], [times[name][i] for i in long])
        rows.append([name, parameters(built[name]), *times[name], slope_all, slope_long,
                     memory[name][-1], loglog_slope(lengths, memory[name]), *decode[name],
                     decode[name][1] / decode[name][0]])
        log(f"{name}: time slope {slope_all:.2f} (all), {slope_long:.2f} (T ≥ {shape['long_from']}); "
            f"decode {decode[name][0]:.2f} -> {decode[name][1]:.2f} ms/token")
    short, far = shape["contexts"]
    columns = ["mixer", "params", *[f"ms @{n}" for n in lengths], "time slope", f"slope T≥{shape['long_from']}",
               f"MiB @{lengths[-1]}", "memory slope", f"decode ms @{short}", f"decode ms @{far}",
               f"decode {far}/{short}"]
    settings = {**shape, "batch": 1, "vocab": 259, "heads": 4, "step": "forward + backward, fused loss",
                "repeats": "median of 3 (T ≤ 4096) or 2", "memory": "torch profiler, self allocations",
                "mixers": MIXERS, "ffn": {name: built[name].decoder.blocks[0].ffn.hidden for name in names}}
    data = {"lengths": lengths, "ms": times, "mib": memory, "contexts": shape["contexts"], "decode_ms": decode}
    return ExperimentResult("linear-time", f"Training step (forward + backward, batch 1) and decoding against "
                            f"sequence length: C={shape['dim']}, {shape['layers']} layers, equal parameter counts",
                            columns, rows, settings, data)


def draw(result: ExperimentResult, fig) -> None:
    """Time and memory against T (log–log), and decode ms/token at the two contexts."""
    data = result.data
    axes = fig.subplots(1, 3)
    for name in data["ms"]:
        axes[0].loglog(data["lengths"], data["ms"][name], marker="o", ms=3, label=name)
        axes[1].loglog(data["lengths"], data["mib"][name], marker="o", ms=3, label=name)
    axes[0].set(xlabel="sequence length T", ylabel="forward + backward (ms)")
    axes[1].set(xlabel="sequence length T", ylabel="peak memory (MiB)")
    names, contexts = list(data["decode_ms"]), data["contexts"]
    width = 0.8 / len(contexts)
    for j, context in enumerate(contexts):
        axes[2].bar([i + j * width for i in range(len(names))], [data["decode_ms"][n][j] for n in names],
                    width, label=f"context {context}")
    axes[2].set_xticks([i + width * (len(contexts) - 1) / 2 for i in range(len(names))], names, fontsize=7)
    axes[2].set(ylabel="decode ms / token")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
