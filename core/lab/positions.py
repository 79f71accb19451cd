"""Pictures of position schemes (``seqzoo positions``): RoPE's wavelengths and what a scaling rule does
to them, a bias against distance per head (ALiBi, T5), an absolute table. The numbers come from
functions that take no matplotlib (``rotary_wavelengths``, ``bias_by_distance``,
``absolute_table``), read off the ``PositionScheme`` hooks so third-party schemes work too.

Shape legend: H heads, T positions, C model dim, P pairs of rotated dims.
"""
from __future__ import annotations

import math
import os
import textwrap
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..errors import InputError
from ..interfaces import PositionScheme
from ..io.build import instantiate
from ..io.checkpoint import load
from ..recipe import resolve
from ..registry import registry
from .plots import PlotError, figure, save_figure


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
