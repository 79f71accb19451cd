"""Shared blocks: one attention + FFN block whose weights serve several layers of a stack (its
sites), each site with low-rank adapters of its own (Zamba, Glorioso et al., 2024; Zamba2, 2024).

A shared block reads u = [x; e], the layer's input beside the stack's input embeddings (2C wide),
or u = x, and computes, with no residual inside,

    S(u) = F(n₂(A(n₁(u))))        A: W -> C wide attention, F: the FFN (C wide)

A layer that names the block (a site s) adds P_s · S_s(u) to its own mixer's input — not to the
residual stream:

    y = x + mixer(n(x + P_s · S_s(u)))

S_s is S with the site's adapters: an adapted projection W u becomes W u + B_s A_s u (a LoRA
without a scale). ``q``, ``k`` and ``v`` adapt the attention's rows of its fused q/k/v projection,
each with a pair of its own; ``ffn`` adapts the FFN's input projections together, one A_s and a B_s
cut among them (Zamba2's gate_up adapter). The shared weights are the stack's; a site's adapters and
P_s are its layer's (``TransformerBlock.site``), and each site keeps a KV cache of its own for the
shared attention (``SiteState``): every site attends over its own keys.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Literal

import torch
from torch import Tensor, nn

from ..errors import ConfigError
from ..interfaces import FeedForward, MixerContext, MixerState
from ..schema import PositiveInt, Spec
from .attention import AttentionConfig, MultiHeadAttention
from .linear import Linear, linear

Adapted = Literal["q", "k", "v", "ffn"]


@dataclass(frozen=True)
class SharedBlockConfig:
    """One entry of a model's ``shared_blocks:`` (layers name it by its index, ``shared_block: i``).

    attention: the block's attention (``AttentionConfig``) over the block's input width W (2C with
    ``concat_embeddings``, else C; ``head_dim`` null = W // heads); its output projection writes C.
    ffn: the C-wide FFN after it, or null for the attention alone. norm: the norms before the
    attention (W wide) and before the FFN (null = the model's norm). position: the attention's
    position scheme (null = the model's). concat_embeddings: the block reads [x; e], the layer's
    input beside the stack's input embeddings (Zamba), not x alone (false). adapters: the projections
    each site adapts with a low-rank pair of its own: q, k, v (the attention's), ffn (the FFN's input
    projections together); none by default. adapter_rank: their rank r (8).
    """

    attention: AttentionConfig
    ffn: Spec["ffn"] | None = None
    norm: Spec["norm"] | None = None
    position: Spec["position"] | None = None
    concat_embeddings: bool = False
    adapters: tuple[Adapted, ...] = ()
    adapter_rank: PositiveInt = 8


class LowRank(nn.Module):
    """B A x, no biases: ``down`` A (C_in -> r), ``up`` B (r -> C_out)."""

    def __init__(self, in_features: int, out_features: int, rank: int) -> None:
        super().__init__()
        self.down = Linear(in_features, rank, bias=False)
        self.up = Linear(rank, out_features, bias=False)

    def forward(self, x: Tensor, rows: slice | None = None) -> Tensor:
        """x (..., C_in) -> (..., C_out), or only the output ``rows`` of B."""
        h = self.down(x)
        return self.up(h) if rows is None else linear(h, self.up.weight[rows])


class SiteState(MixerState):
    """A site layer's decoding state: its mixer's, and its own KV slice of the shared attention."""

    def __init__(self, mixer: MixerState, shared: MixerState) -> None:
        self.mixer, self.shared = mixer, shared

    def reorder(self, rows: Tensor) -> None:
        self.mixer.reorder(rows)
        self.shared.reorder(rows)


def ffn_inputs(ffn: FeedForward) -> list[nn.Linear]:
    """An FFN's input projections: its ``nn.Linear`` children that do not write its output
    (``residual_projections``), in order (a GLU's gate, up; an MLP's up)."""
    return [m for name, m in ffn.named_children()
            if isinstance(m, nn.Linear) and name not in ffn.residual_projections]


class SharedBlock(nn.Module):
    """The shared weights: ``in_norm`` (W), ``attention`` (W -> C), ``ffn_norm`` and ``ffn`` (C; both
    None for the attention alone), built by the caller. ``adapters`` names the projections sites
    adapt and ``rank`` their rank; ``shapes`` gives each adapter's (C_in, C_out), for the sites.

    The adapters ride on forward hooks of the adapted projections, which add the running site's
    B A x to their output while ``forward`` runs for that site, so the shared modules stay ordinary
    modules under their own names."""

    def __init__(self, in_norm: nn.Module, attention: MultiHeadAttention, ffn_norm: nn.Module | None,
                 ffn: FeedForward | None, *, concat_embeddings: bool = False, adapters: tuple[str, ...] = (),
                 rank: int = 8) -> None:
        super().__init__()
        self.in_norm, self.attention, self.ffn_norm, self.ffn = in_norm, attention, ffn_norm, ffn
        self.concat_embeddings, self.adapters, self.rank = concat_embeddings, tuple(adapters), rank
        self._site: SharedSite | None = None
        h, k, d = attention.heads, attention.kv_heads, attention.head_dim
        width = attention.qkv_proj.in_features
        self._rows = {"q": h * d, "k": k * d, "v": k * d}  # the fused projection's parts, in order
        self.shapes = {name: (width, rows) for name, rows in self._rows.items() if name in self.adapters}
        if self.shapes:
            attention.qkv_proj.register_forward_hook(self._adapt_qkv)
        if "ffn" in self.adapters:
            projections = ffn_inputs(ffn) if ffn is not None else []
            if not projections:
                raise ConfigError(f"shared block: adapters name ffn, but the ffn ({type(ffn).__name__}) has no "
                                  f"input projection to adapt; drop ffn from adapters")
            start = 0
            for projection in projections:
                stop = start + projection.out_features
                projection.register_forward_hook(partial(self._adapt_ffn, rows=slice(start, stop)))
                start = stop
            self.shapes["ffn"] = (projections[0].in_features, start)

    @property
    def window(self) -> int | None:
        return self.attention.window

    def new_state(self, batch: int, max_len: int, *, device: torch.device | None = None,
                  dtype: torch.dtype | None = None) -> MixerState:
        """One site's KV slice of the shared attention."""
        return self.attention.new_state(batch, max_len, device=device, dtype=dtype)

    def _adapt_qkv(self, module: nn.Module, args: tuple, out: Tensor) -> Tensor | None:
        site = self._site
        if site is None:
            return None
        x = args[0]
        deltas = [site.adapters[name](x) if name in site.adapters else x.new_zeros(*x.shape[:-1], rows)
                  for name, rows in self._rows.items()]
        return out + torch.cat(deltas, dim=-1)

    def _adapt_ffn(self, module: nn.Module, args: tuple, out: Tensor, *, rows: slice) -> Tensor | None:
        site = self._site
        return None if site is None else out + site.adapters["ffn"](args[0], rows)

    def forward(self, x: Tensor, embeddings: Tensor | None, context: MixerContext, state: MixerState | None,
                site: SharedSite | None = None) -> Tensor:
        """x and the stack's input embeddings (B, T, C) -> S_site(u) (B, T, C)."""
        u = torch.cat([x, embeddings], dim=-1) if self.concat_embeddings else x
        self._site = site
        try:
            y = self.attention(self.in_norm(u), context, state)
            return self.ffn(self.ffn_norm(y)) if self.ffn is not None else y
        finally:
            self._site = None


class SharedSite(nn.Module):
    """A layer's use of shared block ``block``: one ``LowRank`` adapter per entry of ``shapes``
    ({name: (C_in, C_out)}, the block's ``shapes``) of rank ``rank``, and ``proj`` (C -> C, no bias),
    which carries the block's output onto the layer (Zamba2's per-layer ``linear``)."""

    def __init__(self, block: int, shapes: dict[str, tuple[int, int]], rank: int, dim: int) -> None:
        super().__init__()
        self.block = block
        self.adapters = nn.ModuleDict({name: LowRank(i, o, rank) for name, (i, o) in shapes.items()})
        self.proj = Linear(dim, dim, bias=False)

    def forward(self, x: Tensor, embeddings: Tensor | None, shared: SharedBlock, context: MixerContext,
                state: MixerState | None) -> Tensor:
        """x (B, T, C) -> P_s · S_s(u) (B, T, C), what the layer adds to its mixer's input."""
        return self.proj(shared(x, embeddings, context, state, self))
