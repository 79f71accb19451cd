"""Residual layers and the stack that runs them. Every part is built by the caller and handed in
(see ``seqzoo.builder.Parts.stack``), so a block can be tested with plain ``nn.Module`` parts.

A layer is a token mixer (attention, a recurrent cell, ...) and a feed-forward block, each wrapped
in its norms and residual connection. Norm placements (F a sublayer, n a norm):

- ``pre`` (GPT-2, LLaMA, T5): x + F(n(x)), with a final norm after the stack;
- ``post`` (Vaswani 2017, BERT): n(x + F(x));
- ``sandwich`` (Gemma 2/3): x + n₂(F(n₁(x))), a norm before and after each sublayer;
- ``output`` (OLMo 2): x + n(F(x)), a norm on the sublayer's output before the residual add.

``residual: parallel`` (GPT-NeoX, GPT-J, Falcon) runs the mixer and the FFN side by side on the
same input, x + mixer(n₁(x)) + ffn(n₂(x)); ``parallel_shared`` uses one norm for both (GPT-J).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor, nn

from ..errors import InputError
from ..interfaces import Mixer, MixerContext, MixerState, PositionScheme
from .attention import MultiHeadAttention, self_attention_inputs, static_attention_inputs
from .cache import DecodeCache
from .shared import SharedBlock, SharedSite, SiteState

Placement = Literal["pre", "post", "sandwich", "output"]
Residual = Literal["sequential", "parallel", "parallel_shared"]


def check_position_limit(limit: int | None, tokens: int) -> None:
    """A sequence of ``tokens`` must fit a learned position table of ``limit`` rows (None: any)."""
    if limit is not None and tokens > limit:
        raise InputError(f"sequence of {tokens} tokens exceeds the {limit} positions of the "
                         f"learned position table (model.max_seq_len={limit})")


class TransformerBlock(nn.Module):
    """One layer: ``mixer``, optionally ``cross_attn`` (encoder–decoder), and ``ffn``, each in its
    norms (made by calling ``norm()``), residual connection and residual dropout.

    Module names follow the roles: ``mixer_norm``/``ffn_norm`` normalise a sublayer's input (for
    ``post``, its residual sum), ``mixer_out_norm``/``ffn_out_norm`` its output (``sandwich``,
    ``output``); ``mixer`` is the token mixer, whatever its kind (mamba_ssm's ``Block`` names it
    so). ``mixer_norm=False`` leaves out the norm before the mixer (ModernBERT's first layer: its
    input is the embedding norm's output). The recipe validator has checked the combination of
    placement and residual (``seqzoo.builder.plan``); the block wires what it is given.
    ``ffn=None`` leaves out the feed-forward sublayer and its norms (Mamba's layers are a mixer only).
    ``site``: the layer's use of a shared block (``seqzoo.nn.shared``), whose output the stack hands
    ``forward`` as ``lift``: it joins the mixer's input, not the residual stream.
    """

    def __init__(self, mixer: Mixer, ffn: nn.Module | None, norm: Callable[[], nn.Module], *,
                 placement: Placement = "pre", residual: Residual = "sequential", dropout: float = 0.0,
                 cross_attn: MultiHeadAttention | None = None, mixer_norm: bool = True,
                 residual_multiplier: float = 1.0, site: SharedSite | None = None) -> None:
        super().__init__()
        self.placement, self.residual = placement, residual
        self.residual_multiplier = residual_multiplier
        inputs = placement in ("pre", "post", "sandwich")
        outputs = placement in ("sandwich", "output")
        self.mixer_norm = norm() if inputs and mixer_norm and not mixer.empty else None
        self.mixer_out_norm = norm() if outputs and not mixer.empty else None
        self.mixer = mixer
        if cross_attn is not None:
            self.cross_norm = norm() if inputs else None
            self.cross_out_norm = norm() if outputs else None
        self.cross_attn = cross_attn  # None: no cross-attention sublayer (and no norms for one)
        self.ffn_norm = norm() if ffn is not None and inputs and residual != "parallel_shared" else None
        self.ffn_out_norm = norm() if ffn is not None and outputs else None
        self.ffn = ffn
        self.site = site  # None: the layer runs no shared block
        self.dropout = nn.Dropout(dropout)

    def _drop(self, x: Tensor) -> Tensor:
        """A sublayer's output as it joins the residual stream: dropped out while training, times
        ``residual_multiplier`` (Granite's μP ``residual_multiplier``; 1 skips the product)."""
        # Skipping the module call when it cannot change anything saves per-token overhead.
        x = self.dropout(x) if self.training and self.dropout.p > 0 else x
        return x if self.residual_multiplier == 1.0 else x * self.residual_multiplier

    def _sublayer(self, x: Tensor, in_norm: nn.Module | None, out_norm: nn.Module | None, fn,
                  lift: Tensor | None = None) -> Tensor:
        u = x if lift is None else x + lift  # the sublayer's input; the residual stays x
        if self.placement == "post":
            x = x + self._drop(fn(u))
            return in_norm(x) if in_norm is not None else x
        h = fn(in_norm(u) if in_norm is not None else u)
        return x + self._drop(out_norm(h) if out_norm is not None else h)

    def forward(self, x: Tensor, context: MixerContext, state: MixerState | None = None,
                memory: Tensor | None = None, memory_mask: Tensor | None = None, layer: int = 0,
                lift: Tensor | None = None) -> Tensor:
        """x (B, T, C) -> (B, T, C); ``state`` the mixer's decoding state; ``memory`` (B, S, C_m)
        for cross-attention layers (``layer`` keys its projected memory in the cache); ``lift``
        (B, T, C) added to the mixer's input only (a shared block's output, ``site``)."""
        if self.residual != "sequential":
            u = x if lift is None else x + lift
            h = self.mixer_norm(u) if self.mixer_norm is not None else u
            f = h if self.ffn_norm is None else self.ffn_norm(x)
            out = x + self._drop(self.mixer(h, context, state))
            return out + self._drop(self.ffn(f)) if self.ffn is not None else out
        if not self.mixer.empty:
            x = self._sublayer(x, self.mixer_norm, self.mixer_out_norm, lambda h: self.mixer(h, context, state),
                               lift)
        if memory is not None:
            x = self._sublayer(x, self.cross_norm, self.cross_out_norm, lambda h: self.cross_attn.attend_memory(
                h, memory, memory_mask, context.cache, layer))
        return self._sublayer(x, self.ffn_norm, self.ffn_out_norm, self.ffn) if self.ffn is not None else x


class TransformerStack(nn.Module):
    """Blocks over a shared set of position schemes: the embedding-side hook of ``position``,
    optional embedding norm, dropout, the blocks and an optional final norm.

    ``position`` is the stack's scheme (absolute schemes add to the embeddings here); layers that
    use another one (a RoPE base of their own, NoPE) find it in ``layer_positions``, and
    ``layer_scheme[i]`` says which scheme layer i uses (0 = ``position``, j = ``layer_positions[j-1]``).
    Masks, key positions and each scheme's prepared tables are built once per forward for each
    distinct (scheme, window) pair, never per layer. ``causal`` stacks (decoders) mask future keys.
    ``shared_blocks``: blocks whose weights several layers run (``seqzoo.nn.shared``), each before
    its sites' mixers, with its scheme at ``shared_scheme[i]`` (numbered as ``layer_scheme``).
    """

    def __init__(self, blocks: list[TransformerBlock], position: PositionScheme, *, causal: bool,
                 layer_positions: list[PositionScheme] = (), layer_scheme: list[int] | None = None,
                 embed_norm: nn.Module | None = None, final_norm: nn.Module | None = None,
                 dropout: float = 0.0, shared_blocks: list[SharedBlock] = (),
                 shared_scheme: list[int] | None = None) -> None:
        super().__init__()
        self.causal = causal
        self.position = position
        self.layer_positions = nn.ModuleList(layer_positions)
        for scheme in self.schemes:
            scheme.causal = causal
        self.layer_scheme = list(layer_scheme) if layer_scheme is not None else [0] * len(blocks)
        if len(self.layer_scheme) != len(blocks):
            raise ValueError(f"layer_scheme has {len(self.layer_scheme)} entries for {len(blocks)} blocks")
        self.embed_norm = embed_norm if embed_norm is not None else nn.Identity()
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(blocks)
        self.final_norm = final_norm if final_norm is not None else nn.Identity()
        self.shared_blocks = nn.ModuleList(shared_blocks)
        self.shared_scheme = list(shared_scheme) if shared_scheme is not None else [0] * len(shared_blocks)

    @property
    def residual_branches(self) -> int:
        """How many sublayers add into the residual stream: per block its mixer, its cross-attention
        and its FFN, those it has (the count ``seqzoo.nn.init`` scales residual projections by)."""
        return sum((not block.mixer.empty) + (block.cross_attn is not None) + (block.ffn is not None)
                   for block in self.blocks)

    @property
    def schemes(self) -> list[PositionScheme]:
        return [self.position, *self.layer_positions]

    def static_blocker(self) -> str | None:
        """The name of the first position scheme or mixer whose decode step changes shape from
        token to token (so a compiled static step would recompile), or None when there is none."""
        parts = [*self.schemes, *(block.mixer for block in self.blocks), *(s.attention for s in self.shared_blocks)]
        return next((type(part).__name__ for part in parts if not part.compiles_statically), None)

    def new_cache(self, batch: int, max_len: int, *, device: torch.device, dtype: torch.dtype) -> DecodeCache:
        """An empty decode cache: each layer's mixer makes its own state (a shared block's site adds
        its own KV slice of the shared attention)."""
        def state(block: TransformerBlock) -> MixerState:
            own = block.mixer.new_state(batch, max_len, device=device, dtype=dtype)
            if block.site is None:
                return own
            shared = self.shared_blocks[block.site.block].new_state(batch, max_len, device=device, dtype=dtype)
            return SiteState(own, shared)

        return DecodeCache([state(block) for block in self.blocks], batch, max_len, device=device)

    def positions(self, t: int, *, attention_mask: Tensor | None, cache: DecodeCache | None,
                  device: torch.device) -> Tensor:
        """Absolute positions (B|1, T) of T new tokens: after the cached ones, or counting only
        real tokens when a (left-)padding mask (B, S) is given."""
        if attention_mask is not None:
            return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, -t:]
        past = cache.length if cache is not None else 0
        return torch.arange(past, past + t, device=device)[None]

    def forward(self, x: Tensor, *, attention_mask: Tensor | None = None,
                positions: Tensor | None = None, cache: DecodeCache | None = None,
                memory: Tensor | None = None, memory_mask: Tensor | None = None,
                documents: Tensor | None = None) -> Tensor:
        """Token embeddings x (B, T, C) -> hidden states (B, T, C).

        attention_mask (B, S): 1 for real tokens over all S = cached + T keys. positions (B|1, T)
        default to ``self.positions``. memory (B, S_m, C) and memory_mask (B, S_m) feed the
        cross-attention of blocks that have one. documents (B, T): the packed document of each
        token; no token attends across documents (every mixer must read the mask).
        """
        t = x.shape[1]
        if documents is not None:
            blind = next((block.mixer for block in self.blocks if not block.mixer.reads_mask), None)
            if blind is not None:
                raise InputError(f"document masking needs every layer to read an attention mask, but "
                                 f"{type(blind).__name__} carries its state across packed documents; train it "
                                 f"without document_mask")
        static = cache is not None and cache.slot is not None
        if static:
            # A static decode step (see DecodeCache.make_static): the caller checked room and limits
            # and passes the positions; nothing here may depend on the cache's Python length.
            if t != 1 or positions is None:
                raise InputError("a static KV cache decodes one token per step at given positions")
            cache.write_static(positions)  # once per step, before any layer reads the valid slots
        else:
            past = cache.length if cache is not None else 0
            if cache is not None:
                cache.check_room(t)
            check_position_limit(self.position.max_positions, past + t)
            if positions is None:
                positions = self.positions(t, attention_mask=attention_mask, cache=cache, device=x.device)
        x = self.drop(self.embed_norm(self.position.embed(x, positions)))
        embeddings = x if self.shared_blocks else None  # what shared blocks may read beside each layer's input
        schemes = self.schemes
        contexts: dict[tuple[int, int | None], MixerContext] = {}
        cross_mask = memory_mask.bool()[:, None, None, :] if memory_mask is not None else None

        def context_for(scheme_index: int, window: int | None) -> MixerContext:
            key = (scheme_index, window)
            context = contexts.get(key)
            if context is None:  # once per distinct configuration and forward
                scheme = schemes[scheme_index]
                # A scheme's prepared tables do not depend on the window: share them.
                prepared = next((c.prepared for (s, _), c in contexts.items() if s == scheme_index), None)
                if static:
                    context = static_attention_inputs(scheme, positions, cache, window=window, prepared=prepared)
                else:
                    context = self_attention_inputs(scheme, positions, causal=self.causal, cache=cache,
                                                    key_padding=attention_mask, window=window, prepared=prepared,
                                                    documents=documents)
                contexts[key] = context
            return context

        for layer, block in enumerate(self.blocks):
            context = context_for(self.layer_scheme[layer], block.mixer.window)
            state = cache.states[layer] if cache is not None else None
            lift = None
            if block.site is not None:
                index = block.site.block
                shared = self.shared_blocks[index]
                site_state, state = (state.shared, state.mixer) if state is not None else (None, None)
                lift = block.site(x, embeddings, shared, context_for(self.shared_scheme[index], shared.window),
                                  site_state)
            x = block(x, context, state, memory, cross_mask, layer, lift=lift)
        if cache is not None and not static:
            cache.advance(positions)
        return self.final_norm(x)
