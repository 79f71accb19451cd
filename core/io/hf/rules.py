"""Tensor rules: how one seqzoo tensor is made from Hugging Face tensors (renamed, transposed,
fused, split), and back. One list of rules serves import and export, so the two cannot drift."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor


def _one(tensor: Tensor) -> tuple[Tensor, ...]:
    return (tensor,)


@dataclass(frozen=True)
class Rule:
    """seqzoo tensor ``target`` = ``load(*hf tensors named by sources)``; ``save`` inverts it.

    ``save`` must work on any tensor of the target's shape (meta tensors included): the import
    checks the stored shapes against ``save`` applied to the freshly built model. A tuple
    ``target`` names several seqzoo tensors made together (parts of one fused HF tensor, see
    ``split``): ``load`` returns one tensor per target and ``save`` takes them all.
    """

    target: str | tuple[str, ...]
    sources: tuple[str, ...]
    load: Callable[..., Tensor | tuple[Tensor, ...]] = lambda tensor: tensor
    save: Callable[..., tuple[Tensor, ...]] = _one
    #: The sources are one tensor cut along dim 0 wherever its writer chose (``fused(...,
    #: any_cut=True)``): the import checks their rows in all, not each source's.
    any_cut: bool = False

    @property
    def targets(self) -> tuple[str, ...]:
        return self.target if isinstance(self.target, tuple) else (self.target,)

    def load_all(self, *tensors: Tensor) -> tuple[Tensor, ...]:
        """One tensor per target from the HF tensors named by ``sources``."""
        out = self.load(*tensors)
        return tuple(out) if isinstance(self.target, tuple) else (out,)


def copy(target: str, source: str) -> Rule:
    """The same tensor under another name."""
    return Rule(target, (source,))


def transposed(target: str, source: str) -> Rule:
    """GPT-2's ``Conv1D`` stores weights [in, out]; ``nn.Linear`` wants [out, in]."""
    return Rule(target, (source,), lambda w: w.t(), lambda w: (w.t(),))


def fused(target: str, sources: tuple[str, ...], sizes: tuple[int, ...], *, any_cut: bool = False) -> Rule:
    """Separate projections (q, k, v) stacked along the output dim: [q (H·D) | k (K·D) | v (K·D)],
    cut at ``sizes`` on export. ``any_cut``: on import the parts may be cut elsewhere (OLMo-Hybrid's
    q/k/v convs, which transformers saves in three equal chunks)."""
    return Rule(target, tuple(sources), lambda *parts: torch.cat(parts, dim=0),
                lambda t: tuple(t.split(list(sizes), dim=0)), any_cut)


def split(targets: tuple[str, ...], source: str, sizes: tuple[int, ...]) -> Rule:
    """One HF tensor holding several seqzoo tensors stacked along the output dim (ModernBERT's and
    Phi-3's fused [gate | up]): split on import, concatenated again on export."""
    return Rule(tuple(targets), (source,), lambda t: tuple(t.split(list(sizes), dim=0)),
                lambda *parts: (torch.cat(parts, dim=0),))


def fused_per_head(target: str, source: str, heads: int) -> Rule:
    """q/k/v fused per head (BLOOM, GPT-NeoX): the HF projection's output rows are [H, 3, D]
    (head-major), seqzoo's ``qkv_proj`` rows [3, H, D] ([q | k | v]); a weight or a bias,
    reordered both ways."""
    def regroup(t: Tensor, outer: int, inner: int) -> Tensor:  # rows [outer, inner, D] -> [inner, outer, D]
        return t.reshape(outer, inner, -1, *t.shape[1:]).transpose(0, 1).reshape(t.shape)

    return Rule(target, (source,), lambda t: regroup(t, heads, 3), lambda t: (regroup(t, 3, heads),))


def linear(target: str, source: str, bias: bool, *, transpose: bool = False) -> list[Rule]:
    """``target.weight`` (and ``.bias``) from ``source.weight`` (and ``.bias``)."""
    make = transposed if transpose else copy
    rules = [make(f"{target}.weight", f"{source}.weight")]
    return rules + [copy(f"{target}.bias", f"{source}.bias")] if bias else rules


def norm(target: str, source: str, bias: bool = True) -> list[Rule]:
    """A norm's weight (and bias): LayerNorm has both, RMSNorm (T5, LLaMA) only a weight."""
    return linear(target, source, bias)


def renamed(ours: str, theirs: str, names: Mapping[str, str], bias: bool, *, transpose: bool = False) -> list[Rule]:
    """``linear`` for each {seqzoo name: HF name} pair of one layer's projections or norms, under the
    prefixes ``ours`` and ``theirs`` (``decoder.blocks.3.``, ``model.layers.3.``)."""
    return [rule for a, b in names.items() for rule in linear(ours + a, theirs + b, bias, transpose=transpose)]
