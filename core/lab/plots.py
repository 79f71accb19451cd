"""Pictures of what a model does: training curves and attention maps (position schemes:
``seqzoo.lab.positions``).

matplotlib is the ``plot`` extra and is imported only inside the drawing functions (``import
seqzoo`` never loads it); figures are built as ``matplotlib.figure.Figure`` objects and written
with the Agg canvas, so nothing touches pyplot's global state or needs a display.

The numbers behind each picture come from functions that return tensors and take no matplotlib:
``metric_series`` (curves) and ``record_attention`` (attention weights, recorded without changing
the attention code).

Shape legend: B batch, H heads, T queries, S keys, C model dim.
"""
from __future__ import annotations

import importlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from ..errors import InputError, SeqzooError
from ..files import atomic_write
from ..functional import expand_kv, masked_softmax_attend
from ..interfaces import LanguageModel
from ..nn.attention import MultiHeadAttention
from ..nn.generation import generate

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
    """A run's metrics, checked to have a non-empty ``history``: the JSON ``seqzoo train
    --metrics`` writes, or the JSON lines ``seqzoo train`` and ``compare`` log as they go
    (``*.metrics.jsonl``, ``metrics.jsonl``: one history entry a line, the last one with the final
    evaluation)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise InputError(f"{path}: no such metrics file (write one with `seqzoo train RECIPE --metrics {path}`)")
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except UnicodeDecodeError as error:
        raise InputError(f"{path}: not a JSON metrics file ({error})") from None
    try:
        metrics = json.loads(text)
    except json.JSONDecodeError as error:
        if error.msg != "Extra data":  # one JSON document is broken; JSON lines are several
            raise InputError(f"{path}: not a JSON metrics file ({error})") from None
        metrics = _json_lines(path, text)
    if isinstance(metrics, dict) and "history" not in metrics and "step" in metrics:
        metrics = _json_lines(path, text)  # a log of one line
    history = metrics.get("history") if isinstance(metrics, dict) else None
    if not isinstance(history, list) or not history or not all(
            isinstance(e, dict) and "step" in e and "loss" in e for e in history):
        raise InputError(f"{path}: expected {{\"history\": [{{\"step\", \"loss\", \"lr\", ...}}, ...]}} "
                         f"as `seqzoo train --metrics` writes; found no history entries")
    return metrics


def _json_lines(path: str, text: str) -> dict:
    """The metrics of a JSON-lines log, as ``--metrics`` lays them out."""
    history = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            history.append(json.loads(line))
        except json.JSONDecodeError as error:
            raise InputError(f"{path}:{number}: not a JSON line ({error})") from None
    final = history[-1].get("eval") if history and isinstance(history[-1], dict) else None
    return {"history": history, **({"eval": final} if isinstance(final, dict) else {})}


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
        which = {"mixer": "self", "cross_attn": "cross"}.get(parts[-1], parts[-1])
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
