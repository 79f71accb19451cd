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

from ..interfaces import CORE_ARGS, PositionScheme
from ..nn.attention import AttentionConfig
from ..nn.blocks import TransformerBlock, TransformerStack
from ..registry import Registry, registry
from ..schema import Validator
from .plan import ATTENTION, layer_plan


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
        return Validator(self.components.resolve, lambda kind: CORE_ARGS.get(kind, ()))

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
        schemes: dict[str, PositionScheme] = {}
        layer_scheme = []
        # The model's scheme has the heads of its attention: section, or of its first attending layer.
        heads_of = model["attention"] or next((plan.attention for plan in plans if plan.attention), None)
        for spec, config, mixer in [(model["position"], heads_of, None),
                                    *((plan.position, plan.attention, plan.mixer_spec) for plan in plans)]:
            own = self.components.get("mixer", mixer["kind"]).cls.position_dims(mixer, dim) if mixer else None
            if config is None:  # no layer attends: the scheme (none, or an absolute table) sees one wide head
                config = AttentionConfig(heads=1)
            d, heads = own or (config.head_dim or dim // config.heads, config.heads)
            key = repr((sorted(spec.items()) if isinstance(spec, dict) else spec, d, heads))
            if key not in schemes:
                schemes[key] = self.make("position", spec, dim, d, heads, max_seq_len)
            layer_scheme.append(list(schemes).index(key))
        blocks = []
        for plan in plans:
            ffn = self.make("ffn", plan.ffn, dim) if plan.ffn is not None else None
            blocks.append(TransformerBlock(
                self.make("mixer", plan.mixer_spec, dim), ffn, partial(self.make, "norm", plan.norm, dim),
                placement=plan.placement, residual=plan.residual, dropout=dropout,
                cross_attn=self.cross_attention(dim, plan.attention) if cross else None, attn_norm=plan.attn_norm))
        # Post-norm blocks end in a norm already; every other placement needs one at the top.
        top = plans[-1]
        final_norm = self.make("norm", top.norm, dim) if top.placement != "post" else None
        embed_norm = self.make("norm", model["embed_norm"], dim) if model.get("embed_norm") else None
        position, *others = schemes.values()
        return TransformerStack(blocks, position, causal=causal, layer_positions=others,
                                layer_scheme=layer_scheme[1:], embed_norm=embed_norm, final_norm=final_norm,
                                dropout=dropout)
