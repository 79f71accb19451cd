"""Pictures of what a model does: training curves, attention maps, and position schemes.

matplotlib is the ``plot`` extra and is imported only inside the drawing functions (``import
seqzoo`` never loads it); figures are built as ``matplotlib.figure.Figure`` objects and written
with the Agg canvas, so nothing touches pyplot's global state or needs a display.

The numbers behind each picture come from functions that return tensors and take no matplotlib:
``metric_series`` (curves), ``record_attention`` (attention weights, recorded without changing
the attention code), ``rotary_wavelengths``, ``bias_by_distance`` and ``absolute_table``
(position schemes, duck-typed on the ``PositionScheme`` hooks so third-party schemes work too).

Shape legend: B batch, H heads, T queries, S keys, C model dim, P pairs of rotated dims.
"""
from __future__ import annotations

import importlib
import json
import math
import os
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from ..errors import InputError, SeqzooError
from ..files import atomic_write
from ..functional import expand_kv, masked_softmax_attend
from ..interfaces import LanguageModel, PositionScheme
from ..io.build import instantiate
from ..io.checkpoint import load
from ..nn.attention import MultiHeadAttention
from ..nn.generation import generate
from ..recipe import resolve
from ..registry import registry

INSTALL_HINT = "pip install 'seqzoo[plot]'"


class PlotError(SeqzooError):
    """A picture cannot be made: matplotlib is missing, or the model has nothing of that kind."""


def require_matplotlib() -> None:
    """Raise PlotError naming the extra to install unless matplotlib can be imported."""
    try:
        importlib.import_module("matplotlib.figure")
    except ImportError:
        raise PlotError(f"matplotlib is not installed; the picture commands need it: {INSTALL_HINT}") from None


def figure(width: float, height: float):
    """A new matplotlib Figure (no pyplot), or PlotError naming the extra to install."""
    require_matplotlib()
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def save_figure(fig, path: str | os.PathLike) -> str:
    """Write ``fig`` as PNG to ``path`` (parent folders created), atomically, and return the path."""
    path = os.fspath(path)
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    atomic_write(Path(path), lambda tmp: fig.savefig(tmp, format="png"))
    return path


# -- training curves ---------------------------------------------------------------------------------
def load_metrics(path: str | os.PathLike) -> dict:
    """The JSON ``seqzoo train --metrics`` writes, checked to have a non-empty ``history``."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise InputError(f"{path}: no such metrics file (write one with `seqzoo train RECIPE --metrics {path}`)")
    try:
        with open(path, encoding="utf-8") as handle:
            metrics = json.load(handle)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise InputError(f"{path}: not a JSON metrics file ({error})") from None
    history = metrics.get("history") if isinstance(metrics, dict) else None
    if not isinstance(history, list) or not history or not all(
            isinstance(e, dict) and "step" in e and "loss" in e for e in history):
        raise InputError(f"{path}: expected {{\"history\": [{{\"step\", \"loss\", \"lr\", ...}}, ...]}} "
                         f"as `seqzoo train --metrics` writes; found no history entries")
    return metrics


def metric_series(metrics: dict) -> dict[str, list[float]]:
    """Columns of a metrics dict: step, loss, lr, and eval_step/eval_loss/eval_accuracy for the
    history entries that carry an evaluation, the final ``eval`` placed at the last step."""
    history = metrics["history"]
    out: dict[str, list[float]] = {"step": [], "loss": [], "lr": [], "eval_step": [], "eval_loss": [],
                                   "eval_accuracy_step": [], "eval_accuracy": []}
    for entry in history:
        out["step"].append(float(entry["step"]))
        out["loss"].append(float(entry["loss"]))
        if "lr" in entry:
            out["lr"].append(float(entry["lr"]))
    evals = [(e["step"], e["eval"]) for e in history if isinstance(e.get("eval"), dict)]
    final = metrics.get("eval")
    if isinstance(final, dict) and final:
        last = metrics.get("steps", history[-1]["step"])
        if not evals or evals[-1][0] != last:
            evals.append((last, final))
    for step, result in evals:
        if "loss" in result:
            out["eval_step"].append(float(step))
            out["eval_loss"].append(float(result["loss"]))
        if "accuracy" in result:
            out["eval_accuracy_step"].append(float(step))
            out["eval_accuracy"].append(float(result["accuracy"]))
    return out


def plot_metrics(metrics: dict, path: str | os.PathLike, title: str | None = None) -> str:
    """Loss (train and held-out), held-out exact match where logged, and the learning rate
    against the step, one panel each, into ``path``."""
    series = metric_series(metrics)
    panels = 2 + bool(series["eval_accuracy"])
    fig = figure(4.2 * panels, 3.4)
    axes = fig.subplots(1, panels, squeeze=False)[0]
    ax = axes[0]
    ax.plot(series["step"], series["loss"], label="train", lw=1.2)
    if series["eval_loss"]:
        ax.plot(series["eval_step"], series["eval_loss"], "o-", label="held-out", ms=4)
    if min(series["loss"] + series["eval_loss"]) > 0:
        ax.set_yscale("log")
    ax.set(xlabel="step", ylabel="cross-entropy", title="loss")
    ax.legend()
    if series["eval_accuracy"]:
        ax = axes[1]
        ax.plot(series["eval_accuracy_step"], series["eval_accuracy"], "o-", color="C2", ms=4)
        ax.set(xlabel="step", ylabel="exact match", title="held-out accuracy", ylim=(-0.02, 1.02))
        ax.annotate(f"{series['eval_accuracy'][-1]:.3f}", (series["eval_accuracy_step"][-1],
                    series["eval_accuracy"][-1]), textcoords="offset points", xytext=(-28, -14))
    ax = axes[-1]
    if series["lr"]:
        ax.plot(series["step"][: len(series["lr"])], series["lr"], color="C3")
    ax.set(xlabel="step", ylabel="learning rate", title="learning rate")
    ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 2))
    for ax in axes:
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    return save_figure(fig, path)


# -- attention ---------------------------------------------------------------------------------------
def _recording_attend(score: nn.Module, sink: list[Tensor]):
    """An ``attend`` for ``score`` that spells out softmax(scores + bias, masked) and keeps it."""

    def attend(q: Tensor, k: Tensor, v: Tensor, *, mask: Tensor | None = None, bias: Tensor | None = None,
               causal: bool = False, dropout: float = 0.0) -> Tensor:
        heads = q.shape[1]
        logits = score.scores(q, expand_kv(k, heads))  # (B, H, T, S)
        s = logits.shape[-1]
        # The core's own masked softmax applied to the identity returns its weights exactly (mask,
        # bias and rows with no visible key treated as in every other attention call).
        eye = torch.eye(s, dtype=torch.float32, device=q.device).expand(*logits.shape[:2], s, s)
        weights = masked_softmax_attend(logits, eye, mask=mask, bias=bias, causal=causal)  # (B, H, T, S)
        sink.append(weights.detach().cpu())
        probs = weights.to(v.dtype)
        if dropout > 0.0 and score.training:
            probs = torch.nn.functional.dropout(probs, p=dropout)
        return probs @ expand_kv(v, heads)  # (B, H, T, Dv)

    return attend


@contextmanager
def record_attention(model: nn.Module) -> Iterator[dict[str, list[Tensor]]]:
    """Record the attention weights of every ``MultiHeadAttention`` in ``model`` while inside.

    Yields {module name: [weights (B, H, T, S) float32 on the CPU, one per call]}. Each score's
    ``attend`` is replaced, on that instance only, by the explicit masked softmax of its
    ``scores`` (the fused kernels never materialise the weights); the originals come back on exit,
    also after an error. The forward's result is unchanged up to float rounding.
    """
    records: dict[str, list[Tensor]] = {}
    patched: list[nn.Module] = []
    try:
        for name, module in model.named_modules():
            if not isinstance(module, MultiHeadAttention):
                continue
            score = module.score
            if score.normalization != "softmax":
                raise PlotError(f"{name}: score {type(score).__name__} normalises with "
                                f"{score.normalization}, not softmax; its weights cannot be recorded")
            if "attend" in vars(score):
                raise PlotError(f"{name}: attention is already being recorded (nested record_attention)")
            score.attend = _recording_attend(score, records.setdefault(name, []))
            patched.append(score)
        yield records
    finally:
        for score in patched:
            del score.attend


@dataclass
class AttentionPanel:
    """One row of attention maps: ``weights`` (H, T, S) with row and column token labels."""

    title: str
    weights: Tensor
    rows: list[str]
    cols: list[str]
    row_axis: str = "query"
    col_axis: str = "key"


def token_labels(tokenizer, ids: list[int]) -> list[str]:
    """A short printable label per token id: specials by name, spaces as ␣, control characters
    and partial UTF-8 as ``#id``."""
    names = {tokenizer.pad_id: "<pad>", tokenizer.bos_id: "<bos>", tokenizer.eos_id: "<eos>"}
    labels = []
    for i in ids:
        if i in names and i is not None:
            labels.append(names[i])
            continue
        text = tokenizer.decode([i])
        text = text.replace(" ", "␣").replace("\n", "\\n").replace("\t", "\\t")
        labels.append(text if text and text.isprintable() and text != "\ufffd" else f"#{i}")
    return labels


def attention_panels(model: nn.Module, tokenizer, prompt: str, max_new_tokens: int = 32) -> list[AttentionPanel]:
    """Greedy-continue ``prompt`` and return the attention maps of the whole sequence.

    Transformers (decoder_lm, encoder, encoder_decoder): one panel per attention module (encoder
    self-attention, decoder self-attention, cross-attention), recorded in one forward over the
    prompt and its continuation. Recurrent seq2seq with attention: the source–target alignment
    ``last_alignment`` (T, S) of the greedy decode. Others: PlotError.
    """
    model.eval()
    device = next(model.parameters()).device
    kind = model.recipe["model"]["kind"] if model.recipe is not None else type(model).__name__
    eos = tokenizer.eos_id
    has_mha = any(isinstance(m, MultiHeadAttention) for m in model.modules())
    seq2seq = model.family == "seq2seq"
    if seq2seq:
        src = tokenizer.encode(prompt) + ([eos] if eos is not None else [])
    else:
        src = tokenizer.encode(prompt) or [tokenizer.bos_id if tokenizer.bos_id is not None else 0]
    src_ids = torch.tensor([src], device=device)
    if not has_mha and not model.records_alignment:
        if seq2seq:
            raise PlotError(f"{kind} was built with attention: none; its decoder reads only the encoder's "
                            f"final state, so there is no alignment to plot")
        raise PlotError(f"{kind} has no attention to plot; attention maps need a Transformer "
                        f"(decoder_lm, encoder, encoder_decoder) or an rnn_seq2seq with attention")
    if not has_mha:
        model.last_alignment = None
        out = generate(model, src_ids, max(max_new_tokens, 1), eos_id=eos)[0, 1:].tolist()
        weights = model.last_alignment[0].float().cpu()  # (T, S)
        return [AttentionPanel(f"{kind}: source–target alignment", weights[None],
                               token_labels(tokenizer, out[: weights.shape[0]]), token_labels(tokenizer, src),
                               row_axis="output token", col_axis="source token")]
    limit = model.max_positions
    budget = max_new_tokens
    if limit is not None:  # learned position tables end at max_seq_len
        budget = max(0, min(budget, limit - (1 if seq2seq else len(src))))
    new: list[int] = []
    if budget and isinstance(model, LanguageModel):
        out = generate(model, src_ids, budget, eos_id=eos)
        new = out[0, 1 if seq2seq else len(src):].tolist()
        if eos in new:  # eos ends the answer; it is never an input
            new = new[: new.index(eos)]
    with torch.no_grad(), record_attention(model) as records:
        if seq2seq:
            tgt = [model.decoder_start_id] + new
            model(src_ids, torch.tensor([tgt], device=device))
        else:
            tgt = src + new
            model(torch.tensor([tgt], device=device))
    src_labels, tgt_labels = token_labels(tokenizer, src), token_labels(tokenizer, tgt)
    panels = []
    for name, calls in records.items():
        if not calls:
            continue
        weights = calls[0][0]  # (H, T, S)
        is_encoder = seq2seq and name.startswith("encoder")
        rows = src_labels if is_encoder else tgt_labels
        cols = src_labels if (is_encoder or "cross" in name) else tgt_labels
        panels.append(AttentionPanel(_module_title(name), weights, rows, cols))
    return panels


def _module_title(name: str) -> str:
    """``decoder.blocks.1.cross_attn`` -> ``decoder L1 cross``; other names are kept."""
    parts = name.split(".")
    if len(parts) >= 3 and parts[-3] == "blocks" and parts[-2].isdigit():
        which = {"attn": "self", "cross_attn": "cross"}.get(parts[-1], parts[-1])
        return " ".join([*parts[:-3], f"L{parts[-2]}", which])
    return name


def plot_attention(panels: list[AttentionPanel], path: str | os.PathLike, title: str | None = None) -> str:
    """A grid of heat maps, one row per panel (attention module), one column per head."""
    if not panels:
        raise PlotError("no attention weights were recorded (the model ran no attention module)")
    heads = max(p.weights.shape[0] for p in panels)
    longest = max(max(p.weights.shape[-2:]) for p in panels)
    cell = min(3.2, max(2.0, 0.11 * longest))
    if heads * len(panels) == 1:  # one alignment: give it room for its labels and title
        cell = max(4.5, min(8.0, 0.2 * longest))
    fig = figure(cell * heads + 1.2, cell * len(panels) + 0.6)
    axes = fig.subplots(len(panels), heads, squeeze=False)
    show_labels = longest <= 48
    for r, panel in enumerate(panels):
        for h in range(heads):
            ax = axes[r][h]
            if h >= panel.weights.shape[0]:
                ax.axis("off")
                continue
            image = ax.imshow(panel.weights[h].numpy(), cmap="viridis", vmin=0.0, vmax=1.0,
                              aspect="auto", interpolation="nearest")
            ax.set_title(f"{panel.title}" + (f" · head {h}" if panel.weights.shape[0] > 1 else ""),
                         fontsize=7)
            if show_labels:
                size = 6 if longest <= 24 else 4
                ax.set_xticks(range(len(panel.cols)), panel.cols, fontsize=size)
                ax.set_yticks(range(len(panel.rows)), panel.rows, fontsize=size)
            else:
                ax.tick_params(labelsize=6)
            if h == 0:
                ax.set_ylabel(panel.row_axis, fontsize=7)
            if r == len(panels) - 1:
                ax.set_xlabel(panel.col_axis, fontsize=7)
    fig.colorbar(image, ax=axes, shrink=0.6, label="attention weight")
    if title:
        fig.suptitle(title, fontsize=9)
    return save_figure(fig, path)


# -- position schemes --------------------------------------------------------------------------------
def _overrides(scheme: PositionScheme, hook: str) -> bool:
    return getattr(type(scheme), hook) is not getattr(PositionScheme, hook)


def rotary_wavelengths(scheme: PositionScheme, length: int | None = None) -> dict:
    """What a rotary scheme with ``angles(positions) -> (cos, sin)`` does to each pair k.

    Returns pair index, ``scaled`` wavelengths 2π/ω'_k read back from the scheme's own angles for
    positions 0..length−1 (dynamic rules depend on the length; default the scaling's
    factor × original context, else ``max_seq_len``), ``original`` wavelengths 2π·base^(2k/d_r)
    (when the scheme has ``base`` and ``rotary_dim``), and the ``attention_factor`` (cos/sin
    amplitude). Tensors are float64, (P,).
    """
    rotary = scheme.rotary()
    context = rotary.context
    if length is None:
        length = int(round(context * rotary.factor))
    positions = torch.arange(max(length, 2))[None]
    with torch.no_grad():
        cos, sin = rotary.angles(positions)  # (1, 1, T, P)
    cos, sin = cos[0, 0].double(), sin[0, 0].double()
    factor = float(torch.hypot(cos[0], sin[0]).mean())
    omega = torch.atan2(sin[1], cos[1])  # p = 1: θ = ω' (ω' <= 1 < π, no wrap)
    out = {"pair": torch.arange(omega.shape[0]), "scaled": 2 * math.pi / omega, "attention_factor": factor,
           "context": int(context), "length": int(length)}
    d = rotary.rotary_dim
    k = torch.arange(d // 2, dtype=torch.float64)
    out["original"] = 2 * math.pi * rotary.base ** (2 * k / d)
    return out


def bias_by_distance(scheme: PositionScheme, max_distance: int) -> tuple[Tensor, Tensor]:
    """The additive logit bias against relative position, per head -> (offsets (N,), bias (H, N)).

    Causal schemes: a query at ``max_distance`` against keys 0..max_distance, offsets are the
    distances p_q − p_k from 0 up. Bidirectional ones: offsets p_k − p_q from −max_distance to
    +max_distance. Raises PlotError when the bias depends on the query's content (Shaw, XL).
    """
    n = max_distance
    q_pos = torch.tensor([[n]])
    k_pos = torch.arange(n + 1)[None] if scheme.causal else torch.arange(2 * n + 1)[None]
    probe = torch.zeros(1, scheme.heads, 1, scheme.head_dim)
    with torch.no_grad():
        bias = scheme.bias(probe, q_pos, k_pos)
        other = scheme.bias(torch.randn(probe.shape, generator=torch.Generator().manual_seed(0)), q_pos, k_pos)
    if bias is None:
        raise PlotError(f"position {type(scheme).__name__} adds no bias")
    if not torch.allclose(bias.float(), other.float()):
        raise PlotError(f"position {type(scheme).__name__}: the bias depends on the query's content, "
                        f"not on distance alone; there is no per-distance curve to plot")
    bias = bias[0, :, 0].float()  # (H, S)
    if scheme.causal:
        return torch.arange(n + 1), bias.flip(-1)  # key j is at distance n − j: distance 0 first
    return torch.arange(-n, n + 1), bias


def absolute_table(scheme: PositionScheme, length: int) -> Tensor:
    """What an absolute scheme adds to the token embeddings at positions 0..length−1 -> (T, C)."""
    with torch.no_grad():
        x = torch.zeros(1, length, scheme.dim)
        return scheme.embed(x, torch.arange(length)[None])[0].float()


@dataclass
class PositionPicture:
    """What ``plot_positions`` draws for one scheme: kind (rotary, bias, absolute, nothing) and data."""

    kind: str
    name: str
    data: dict = field(default_factory=dict)
    note: str = ""


def describe_position(scheme: PositionScheme, name: str, length: int | None = None) -> PositionPicture:
    """Classify ``scheme`` by the hooks it overrides and compute the numbers to draw."""
    label = f"{name} ({'causal' if scheme.causal else 'bidirectional'})"
    if scheme.rotary() is not None and _overrides(scheme, "rotate"):
        return PositionPicture("rotary", label, rotary_wavelengths(scheme, length))
    if _overrides(scheme, "bias"):
        span = length or min(scheme.max_seq_len - 1, 256)
        try:
            offsets, bias = bias_by_distance(scheme, span)
        except PlotError as error:
            return PositionPicture("nothing", label, note=str(error))
        return PositionPicture("bias", label, {"offset": offsets, "bias": bias})
    if _overrides(scheme, "embed"):
        span = length or min(scheme.max_seq_len, 512)
        return PositionPicture("absolute", label, {"table": absolute_table(scheme, span)})
    if _overrides(scheme, "rotate"):
        return PositionPicture("nothing", label, note=f"{type(scheme).__name__} changes q/k without "
                               f"per-pair angles (its rotary() gives none); nothing to plot")
    order = ("order comes only from the causal mask" if scheme.causal
             else "attention cannot tell positions apart")
    return PositionPicture("nothing", label, note=f"no position signal is added (embed, rotate and bias are "
                           f"identities; {order}): nothing to plot")


def plot_positions(pictures: list[PositionPicture], path: str | os.PathLike, title: str | None = None,
                   note: str | None = None) -> str:
    """One row per scheme: RoPE wavelengths and scaling ratio, bias against distance per head, or
    the position table and its cosine self-similarity; a text panel when there is nothing.
    ``note`` is printed under the title."""
    heights = [1.0 if p.kind == "nothing" else 3.6 for p in pictures]
    fig = figure(10.0 if max(heights) > 1 else 7.0, sum(heights) + 0.5)
    axes = fig.subplots(len(pictures), 2, squeeze=False, gridspec_kw={"height_ratios": heights})
    for row, pic in zip(axes, pictures):
        left, right = row
        if pic.kind == "rotary":
            d = pic.data
            if "original" in d:
                left.semilogy(d["pair"], d["original"], "--", color="C0", label="original 2π·base^(2k/d)")
            left.semilogy(d["pair"], d["scaled"], color="C1", label=f"as used (length {d['length']})")
            left.axhline(d["context"], color="gray", lw=0.8, ls=":", label=f"context {d['context']}")
            if d["length"] != d["context"]:
                left.axhline(d["length"], color="gray", lw=0.8, ls="-.", label=f"length {d['length']}")
            left.set(xlabel="pair index k", ylabel="wavelength 2π/ω_k (positions)")
            left.set_title(f"{pic.name}: wavelength per pair", fontsize=9)
            left.legend(fontsize=7)
            if "original" in d:
                right.plot(d["pair"], d["scaled"] / d["original"], color="C2")
                right.set(xlabel="pair index k", ylabel="λ'_k / λ_k")
                right.set_title(f"stretch per pair (1 = kept); attention factor {d['attention_factor']:.4f}",
                                fontsize=9)
            else:
                right.axis("off")
        elif pic.kind == "bias":
            offsets, bias = pic.data["offset"], pic.data["bias"]
            for h in range(bias.shape[0]):
                left.plot(offsets, bias[h], lw=1, label=f"head {h}")
            xlabel = "distance p_q − p_k" if offsets[0] >= 0 else "offset p_k − p_q"
            left.set(xlabel=xlabel, ylabel="logit bias")
            left.set_title(f"{pic.name}: bias per head", fontsize=9)
            if bias.shape[0] <= 16:
                left.legend(fontsize=6, ncol=2)
            image = right.imshow(bias.numpy(), aspect="auto", cmap="magma", interpolation="nearest",
                                 extent=(float(offsets[0]) - 0.5, float(offsets[-1]) + 0.5,
                                         bias.shape[0] - 0.5, -0.5))
            right.set(xlabel=xlabel, ylabel="head", yticks=range(bias.shape[0]))
            right.set_title("bias, heads × distance", fontsize=9)
            fig.colorbar(image, ax=right, shrink=0.8)
        elif pic.kind == "absolute":
            table = pic.data["table"]
            image = left.imshow(table.numpy(), aspect="auto", cmap="RdBu_r", interpolation="nearest")
            left.set(xlabel="model dim", ylabel="position")
            left.set_title(f"{pic.name}: added to the embeddings", fontsize=9)
            fig.colorbar(image, ax=left, shrink=0.8)
            unit = torch.nn.functional.normalize(table, dim=-1)
            image = right.imshow((unit @ unit.T).numpy(), cmap="viridis", vmin=-1, vmax=1, interpolation="nearest")
            right.set(xlabel="position", ylabel="position")
            right.set_title("cosine similarity between positions", fontsize=9)
            fig.colorbar(image, ax=right, shrink=0.8)
        else:
            left.axis("off")
            right.axis("off")
            left.text(0.0, 0.5, f"{pic.name}\n{_wrap(pic.note, 90)}", fontsize=9, va="center",
                      transform=left.transAxes)
            continue
        left.grid(alpha=0.3)
        if pic.kind == "rotary":
            right.grid(alpha=0.3)
    if title or note:
        fig.suptitle("\n".join(filter(None, [title, note])), fontsize=9)
    return save_figure(fig, path)


def _wrap(text: str, width: int) -> str:
    return "\n".join(textwrap.wrap(text, width))


def position_schemes(source: str, overrides: list[str] | None = None
                     ) -> tuple[list[tuple[str, PositionScheme]], str]:
    """The position schemes of a recipe (name, path or dict) or of a checkpoint (a file saved by
    seqzoo) -> ([(stack name, scheme)], note).

    From a recipe the model is built on the meta device (nothing allocated, so ``gpt2`` or
    ``llama2-7b`` cost nothing) to find its stacks, and each stack's scheme is then built alone on
    the CPU; learned tables (``learned``, ``t5``) are then at their random initialisation, which
    the note says. A checkpoint is loaded and its trained schemes are used as they are.
    """
    note = ""
    if os.path.isfile(source) and source.endswith(".safetensors"):
        if overrides:
            raise InputError("--set applies to recipes, not to checkpoints")
        model = load(source, device="cpu")
        kind = _kind(model.recipe["model"].get("position"))
        found = [(_stack(name, kind), m) for name, m in model.named_modules() if isinstance(m, PositionScheme)]
        return found, note
    resolved = resolve(source, overrides)
    skeleton = instantiate(resolved, device="meta")
    spec = resolved.data["model"].get("position")
    found = []
    for name, m in skeleton.named_modules():
        if not isinstance(m, PositionScheme):
            continue
        scheme = registry().create("position", spec, m.dim, m.head_dim, m.heads, m.max_seq_len)
        scheme.causal = m.causal
        found.append((_stack(name, _kind(spec)), scheme))
        if any(p.requires_grad for p in scheme.parameters()):
            note = "learned weights at their random initialisation; give a trained checkpoint to see them trained"
    return found, note


def _kind(spec) -> str:
    return spec if isinstance(spec, str) else str((spec or {}).get("kind", "?"))


def _stack(module_name: str, kind: str) -> str:
    """``decoder.position`` + rope -> ``decoder: rope``."""
    stack = module_name.rsplit(".", 1)[0] if "." in module_name else module_name or "model"
    return f"{stack}: {kind}"
