"""The builder: the one place that turns a model section's specs into modules.

A model constructor receives a ``Parts`` as its core argument (``CORE_ARGS["model"]``) and asks it
for what its recipe names: a component (``make``), a factory of one (``factory``: a recurrent
stack's cells), or a whole ``TransformerStack`` (``stack``). ``Parts`` holds the registry it
builds from — passed in, not the global one — so a model can be built against any registry, and
the nn modules it assembles receive built modules only. torchtune's ``_component_builders`` play
the same role.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from typing import Any

from torch import nn

from ..interfaces import PositionScheme
from ..nn.attention import AttentionConfig
from ..nn.blocks import TransformerBlock, TransformerStack
from ..nn.linear import Linear
from ..nn.shared import SharedBlock, SharedSite
from ..registry import Registry, registry
from ..schema import Validator
from .plan import ATTENTION, layer_plan, recipe_validator

#: The model-section keys a ``TransformerStack`` is built from (``Parts.stack``): the keys every
#: Transformer-stack model (``decoder_lm``, ``encoder``) takes under the same names.
#: A model takes ``shared_blocks`` only if it runs them (``decoder_lm``).
STACK_KEYS = ("dim", "layers", "max_seq_len", "attention", "ffn", "position", "norm", "placement", "residual",
              "residual_multiplier", "mixer", "embed_norm", "dropout", "layer_types", "pattern", "layer_overrides",
              "shared_blocks")


def stack_section(values: dict) -> dict:
    """The ``STACK_KEYS`` of ``values`` (a model constructor's ``locals()``: its parameters are the
    recipe's keys) that it has, the section ``Parts.stack`` builds from."""
    return {key: values[key] for key in STACK_KEYS if key in values}


class Parts:
    """Builds the components of one registry: ``Parts(registry)``, or ``installed()``."""

    def __init__(self, components: Registry) -> None:
        self.components = components

    @classmethod
    def installed(cls) -> Parts:
        """The builder over the components installed in this process (the CLI's and ``build``'s)."""
        return cls(registry())

    def validator(self) -> Validator:
        """A recipe validator over this builder's components."""
        return recipe_validator(self.components)

    def make(self, kind: str, spec: str | dict, *core_args: Any, **kwargs: Any) -> nn.Module:
        """The registered component a spec names, given its kind's core arguments."""
        return self.components.create(kind, spec, *core_args, **kwargs)

    def factory(self, kind: str, spec: str | dict) -> Callable[..., nn.Module]:
        """``make`` with the spec bound: call it with the core arguments, once per part wanted
        (a recurrent stack's cells: ``factory("cell", spec)(input_size, hidden_size)``)."""
        return partial(self.make, kind, spec)

    def cross_attention(self, dim: int, config: AttentionConfig, memory_dim: int | None = None) -> nn.Module:
        """Attention from ``dim``-wide queries to an encoder's memory, configured like self-attention."""
        return self.make("mixer", {**ATTENTION, **asdict(config)}, dim, cross=True, memory_dim=memory_dim)

    def stack(self, model: dict, *, layers_key: str = "layers", causal: bool, cross: bool = False) -> TransformerStack:
        """A ``TransformerStack`` for a model section (its ``dim``, ``max_seq_len``, ``dropout``,
        ``embed_norm`` and per-layer parts). ``layers_key`` names the depth key (an encoder–decoder
        has two); ``cross`` gives every block cross-attention to an encoder memory.

        Layers with the same position scheme (and head shape) share one instance, so its
        per-forward work is done once; the model's own scheme comes first, as the stack's
        ``position`` (the one that adds to embeddings and bounds the length)."""
        dim, max_seq_len, dropout = model["dim"], model["max_seq_len"], model.get("dropout", 0.0)
        plans = layer_plan({**model, "layers": model[layers_key]}, validator=self.validator())
        section = model.get("attention")
        section = asdict(section) if isinstance(section, AttentionConfig) else section

        def dims(mixer: dict, width: int = dim) -> tuple[int, int] | None:  # (head_dim, heads) of an attending mixer
            cls = self.components.get("mixer", mixer["kind"]).cls
            return cls.position_dims(mixer, width) or next(filter(None, map(dims, cls.branches(mixer))), None)

        # The stack's own scheme (embedding-side, bounding the length) is shaped for the attention:
        # section, else the first layer that attends; a layer that does not attend (a recurrence
        # never calls the scheme) shares it. With no attending layer at all, the scheme (none, or
        # a table) sees one head as wide as the model.
        own = dims({**ATTENTION, **section}) if section else next(
            filter(None, (dims(plan.mixer_spec) for plan in plans)), None)
        own = own or (dim, 1)
        # Shared blocks attend over their own input width W (2C when they read [x; e]).
        shared_specs = model.get("shared_blocks") or []
        widths = [2 * dim if block["concat_embeddings"] else dim for block in shared_specs]
        shared_positions = [(block["position"] or model["position"], dims({**ATTENTION, **block["attention"]}, width))
                            for block, width in zip(shared_specs, widths)]
        schemes: dict[str, PositionScheme] = {}
        layer_scheme = []
        for spec, (d, heads) in [(model["position"], own),
                                 *((plan.position, dims(plan.mixer_spec) or own) for plan in plans),
                                 *shared_positions]:
            key = repr((sorted(spec.items()) if isinstance(spec, dict) else spec, d, heads))
            if key not in schemes:
                schemes[key] = self.make("position", spec, dim, d, heads, max_seq_len)
            layer_scheme.append(list(schemes).index(key))
        layer_scheme, shared_scheme = layer_scheme[:len(plans) + 1], layer_scheme[len(plans) + 1:]
        shared = [self.shared_block(spec, width, model) for spec, width in zip(shared_specs, widths)]
        blocks = []
        for plan in plans:
            ffn = self.make("ffn", plan.ffn, dim) if plan.ffn is not None else None
            index = plan.shared_block
            site = None if index is None else SharedSite(index, shared[index].shapes, shared[index].rank, dim)
            blocks.append(TransformerBlock(
                self.make("mixer", plan.mixer_spec, dim), ffn, partial(self.make, "norm", plan.norm, dim),
                placement=plan.placement, residual=plan.residual, dropout=dropout,
                cross_attn=self.cross_attention(dim, plan.attention) if cross else None,
                mixer_norm=plan.mixer_norm, residual_multiplier=plan.residual_multiplier, site=site))
        # Post-norm blocks end in a norm already; every other placement needs one at the top.
        top = plans[-1]
        final_norm = self.make("norm", top.norm, dim) if top.placement != "post" else None
        embed_norm = self.make("norm", model["embed_norm"], dim) if model.get("embed_norm") else None
        position, *others = schemes.values()
        return TransformerStack(blocks, position, causal=causal, layer_positions=others,
                                layer_scheme=layer_scheme[1:], embed_norm=embed_norm, final_norm=final_norm,
                                dropout=dropout, shared_blocks=shared, shared_scheme=shared_scheme)

    def shared_block(self, spec: dict, width: int, model: dict) -> SharedBlock:
        """A model's shared block (a validated ``SharedBlockConfig`` mapping) reading ``width``
        features: its attention is built at that width and writes the model's ``dim``."""
        dim = model["dim"]
        norm = spec["norm"] or model["norm"]
        attention = self.make("mixer", {**ATTENTION, **spec["attention"]}, width)
        # The attention reads W = 2C features (Zamba's [x; e]) and writes C: its output projection
        # is made C wide (the constructor's own is W wide, as self-attention keeps its width).
        out = attention.out_proj
        attention.out_proj = Linear(out.in_features, dim, bias=out.bias is not None)
        ffn = self.make("ffn", spec["ffn"], dim) if spec["ffn"] is not None else None
        return SharedBlock(self.make("norm", norm, width), attention,
                           self.make("norm", norm, dim) if ffn is not None else None, ffn,
                           concat_embeddings=spec["concat_embeddings"], adapters=tuple(spec["adapters"]),
                           rank=spec["adapter_rank"])
