"""Per-layer patterns: a model section's parts resolved for every layer, validated where they
were written.

A uniform stack is ``layers: N``. A heterogeneous one names layer types and a repeating pattern:

    layers: 12
    layer_types:
      local:  {attention: {window: 512}, position: {base: 10000}}
      global: {position: {base: 1000000}}
    pattern: [local, local, local, local, local, global]   # repeats; layer i is pattern[i % 6]
    layer_overrides: {0: global, 7: {ffn: {hidden: 512}}}  # per index: a type, or parts

A layer type overrides any per-layer part of the model section: ``mixer``, ``attention`` (window,
score, softcap, QK-norm, ...), ``position`` (another scheme, ``none`` for NoPE layers, a RoPE base
or scaling of its own), ``ffn``, ``norm``, ``placement``, ``residual`` and ``residual_multiplier``;
``mixer_norm: false`` drops the norm before the mixer (ModernBERT's layer 0, whose input is the
embedding norm's output); and ``shared_block: i`` runs the model's ``shared_blocks[i]`` before the
layer's mixer (Zamba2; ``seqzoo.nn.shared``).
A mapping is merged into the model's value (a different ``kind`` replaces it); a name replaces it.

The ``attention:`` section is shorthand for ``mixer: {kind: attention, ...}`` with the same keys
(``AttentionConfig``): a layer whose mixer is null (or a bare ``attention``) attends with it, and a
plan's ``mixer`` is then the full attention spec, built like any other mixer.

``layer_plan`` validates all of that; errors name the layer type or index and the key. It reads
components only through the recipe validator it is given, so it needs no registry of its own.
"""
from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, replace
from typing import Any

from ..errors import closest
from ..interfaces import CORE_ARGS, PositionScheme
from ..nn.attention import AttentionConfig, check_attention
from ..nn.blocks import Placement, Residual
from ..registry import Registry, registry
from ..schema import NonNegativeInt, PositiveFloat, SchemaError, Validator, dotted, instantiate

ATTENTION = {"kind": "attention"}  # the mixer of a layer whose mixer is null: the attention: section

#: The model-section keys a layer type may override.
LAYER_KEYS = ("mixer", "attention", "position", "ffn", "norm", "placement", "residual", "mixer_norm",
              "residual_multiplier", "shared_block")
#: Their values when a model section does not have the key (an encoder–decoder has no residual:;
#: ``mixer_norm`` and ``shared_block`` are per layer only).
DEFAULTS = {"mixer": None, "residual": "sequential", "placement": "pre", "mixer_norm": True,
            "residual_multiplier": 1.0, "shared_block": None}


@dataclass(frozen=True)
class LayerPlan:
    """The resolved parts of one layer: validated specs (``{kind: name, **params}``; an attending
    layer's mixer is ``{kind: attention}`` and its keys are in ``attention``), the attention
    section as an ``AttentionConfig``, and the layer type's name (None for the model's defaults).
    ``mixer_norm``: whether the block has its norm before the mixer (``TransformerBlock.mixer_norm``).
    ``shared_block``: the index of the model's shared block the layer runs first, or None."""

    type: str | None
    mixer: dict
    attention: AttentionConfig | None  # None: the model has no attention: section, and no layer attends
    position: dict
    ffn: dict | None  # None: no feed-forward sublayer
    norm: dict
    placement: Placement
    residual: Residual
    mixer_norm: bool = True
    residual_multiplier: float = 1.0
    shared_block: int | None = None

    @property
    def mixer_spec(self) -> dict:
        """The spec the mixer is built from: ``mixer``, or for attention the full
        ``{kind: attention, **AttentionConfig}`` (``mixer`` alone stays ``{kind: attention}``, so
        plans compare by what differs: two layers that differ in their window differ in
        ``attention`` only)."""
        if self.mixer == ATTENTION and self.attention is not None:
            return {**ATTENTION, **asdict(self.attention)}
        return self.mixer


def merge(base: Any, override: Any) -> Any:
    """``override`` over ``base``: mappings merge key by key (a changed ``kind`` replaces the
    whole mapping: another component's parameters must not leak in); a name is ``{kind: name}``."""
    if isinstance(override, str) and isinstance(base, dict):
        override = {"kind": override}
    if isinstance(base, str) and isinstance(override, dict):
        base = {"kind": base}
    if not isinstance(base, dict) or not isinstance(override, dict):
        return copy.deepcopy(override)
    if "kind" in override and base.get("kind", override["kind"]) != override["kind"]:
        return copy.deepcopy(override)
    out = copy.deepcopy(base)
    for key, value in override.items():
        out[key] = merge(out[key], value) if key in out and isinstance(value, dict) else copy.deepcopy(value)
    return out


def recipe_validator(components: Registry | None = None) -> Validator:
    """A validator over ``components`` (default: the installed ones); recipe validation passes
    its own, which also records provenance."""
    return Validator((components or registry()).resolve, lambda kind: CORE_ARGS.get(kind, ()))


def layer_plan(model: dict, path: tuple = ("model",), validator: Validator | None = None) -> list[LayerPlan]:
    """The parts of every layer of a (validated) model section, in order. Raises SchemaError at
    the layer type, index and key that is wrong. ``validator`` records the components it meets
    (recipe validation passes its own, for provenance)."""
    validator = validator or recipe_validator()
    layers, dim = model["layers"], model["dim"]
    types = model.get("layer_types") or {}
    pattern = model.get("pattern")
    overrides = model.get("layer_overrides") or {}
    base = {key: model.get(key, DEFAULTS.get(key)) for key in LAYER_KEYS}
    base["attention"] = asdict(base["attention"]) if isinstance(base["attention"], AttentionConfig) \
        else base["attention"]
    if pattern is not None:
        if not pattern:
            raise SchemaError((*path, "pattern"), "an empty pattern; name at least one layer type")
        if len(pattern) > layers:
            raise SchemaError((*path, "pattern"), f"{len(pattern)} entries for layers={layers}; the pattern "
                                                  f"names one type per layer and repeats, so list at most {layers}")
        for index, name in enumerate(pattern):
            _check_type_name(name, types, (*path, "pattern", index))
    elif types:
        raise SchemaError((*path, "layer_types"), "layer types without a pattern are never used; add "
                                                  "pattern: [TYPE, ...]")
    for name, override in types.items():
        if override is not None and not isinstance(override, dict):
            raise SchemaError((*path, "layer_types", name), f"a layer type is a mapping of parts "
                                                            f"({', '.join(LAYER_KEYS)}), got {override!r}")
        _check_keys(override or {}, (*path, "layer_types", name))
    resolved_types = {name: replace(_resolve(base, override or {}, path, (*path, "layer_types", name), dim,
                                             validator), type=name)
                      for name, override in types.items()}
    default = _resolve(base, {}, path, path, dim, validator)
    plans = []
    for index in range(layers):
        name = pattern[index % len(pattern)] if pattern else None
        plan = resolved_types[name] if name is not None else default
        extra = _override_for(overrides, index, layers, path)
        if extra is not None:
            where = (*path, "layer_overrides", index)
            if isinstance(extra, str):
                _check_type_name(extra, types, where)
                plan = resolved_types[extra]
            else:
                if not isinstance(extra, dict):
                    raise SchemaError(where, f"expected a layer type name or a mapping of parts, got {extra!r}")
                _check_keys(extra, where)
                merged = merge(types.get(name) or {}, extra) if name is not None else extra
                plan = replace(_resolve(base, merged, path, where, dim, validator), type=name)
        plans.append(plan)
    return plans


def _override_for(overrides: dict, index: int, layers: int, path: tuple) -> Any:
    for key, value in overrides.items():
        try:
            number = int(key)
        except (TypeError, ValueError):
            raise SchemaError((*path, "layer_overrides", key), f"keys are layer indices 0..{layers - 1}, "
                                                               f"got {key!r}") from None
        if not 0 <= number < layers:
            raise SchemaError((*path, "layer_overrides", key), f"layer {number} does not exist "
                                                               f"(layers={layers}: indices 0..{layers - 1})")
        if number == index:
            return value
    return None


def _check_type_name(name: Any, types: dict, where: tuple) -> None:
    if name not in types:
        match = closest(str(name), types)
        defined = ", ".join(types) or "none"
        fix = f"did you mean {match!r}?" if match else f"define it under layer_types (defined: {defined})"
        raise SchemaError(where, f"unknown layer type {name!r}; {fix}")


def _check_keys(override: dict, where: tuple) -> None:
    for key in override:
        if key not in LAYER_KEYS:
            match = closest(str(key), LAYER_KEYS)
            fix = f"did you mean {match!r}?" if match else f"a layer type overrides {', '.join(LAYER_KEYS)}"
            raise SchemaError((*where, key), f"unknown layer part {key!r}; {fix}")


def _resolve(base: dict, override: dict, model_path: tuple, where: tuple, dim: int,
             validator: Validator) -> LayerPlan:
    """One layer type: ``override`` merged over the model's parts, each validated where it was
    written (``where`` for the type's own keys, ``model_path`` for the model's)."""
    part = {key: merge(base[key], override[key]) if key in override else base[key] for key in LAYER_KEYS}
    at = lambda key: (*where, key) if key in override else (*model_path, key)  # noqa: E731
    position = validator.spec("position", part["position"], at("position"))
    if "position" in override and _embeds(validator, position["kind"], at("position")) \
            and part["position"] != base["position"]:
        raise SchemaError(at("position"), f"{position['kind']!r} adds to the token embeddings, which every "
                                          f"layer shares; a layer type may use rotary or bias schemes, or none")
    mixer, attention = _mixer(part, at, where, model_path, dim, validator)
    return LayerPlan(
        type=None, mixer=mixer, attention=None if attention is None else instantiate(attention, AttentionConfig),
        position=position,
        ffn=None if part["ffn"] is None else validator.spec("ffn", part["ffn"], at("ffn")),
        norm=validator.spec("norm", part["norm"], at("norm")),
        placement=validator.value(part["placement"], Placement, at("placement")),
        residual=validator.value(part["residual"], Residual, at("residual")),
        mixer_norm=validator.value(part["mixer_norm"], bool, at("mixer_norm")),
        residual_multiplier=validator.value(part["residual_multiplier"], PositiveFloat, at("residual_multiplier")),
        shared_block=validator.value(part["shared_block"], NonNegativeInt | None, at("shared_block")))


def _mixer(part: dict, at, where: tuple, model_path: tuple, dim: int,
           validator: Validator) -> tuple[dict, dict | None]:
    """The layer's mixer spec and its attention section (validated, or None). A null or bare
    ``attention`` mixer takes the section's keys; ``mixer: {kind: attention, heads: …}`` is the
    long form, for a model without a section."""
    section = part["attention"]
    mixer = part["mixer"] if part["mixer"] is not None else ATTENTION["kind"]
    kind = mixer if isinstance(mixer, str) else mixer.get("kind") if isinstance(mixer, dict) else None
    is_attention = kind is not None and validator.component("mixer", kind, at("mixer")) \
        is validator.component("mixer", ATTENTION["kind"], at("mixer"))
    if is_attention and isinstance(mixer, dict) and set(mixer) != {"kind"}:
        if section is not None:
            raise SchemaError(at("mixer"), "the attention parameters are given twice, here and under "
                                           "attention:; keep one (attention: is shorthand for this mixer)")
        section = {key: value for key, value in mixer.items() if key != "kind"}
        path = at("mixer")
    else:
        path = at("attention")
    attention = None
    if section is not None:
        attention = validator.params(AttentionConfig, section, path)
        check_attention(attention, dim, path)
    if not is_attention:
        return validator.spec("mixer", mixer, at("mixer")), attention
    if attention is None:
        layer = f"{dotted(where)}'s" if where != model_path else "the layers'"
        raise SchemaError(at("attention"), f"missing required key 'attention': {layer} mixer is attention (the "
                                           f"default when mixer is null); give attention: {{heads: H, ...}} or "
                                           f"another mixer")
    # The section's own components were recorded where it was written; the mixer is not recorded
    # again (a null mixer is not a component the recipe names). Its keys live in ``attention``.
    return dict(ATTENTION), attention


def _embeds(validator: Validator, kind: str, path: tuple) -> bool:
    """Whether a position scheme adds to the token embeddings (which every layer shares)."""
    return validator.component("position", kind, path).embed is not PositionScheme.embed


def check_layers(model: dict, path: tuple, validator: Validator, *, causal: bool = True) -> None:
    """Recipe validation of a model section's per-layer settings (a ``check_recipe`` helper):
    every rule of a layer's parts is checked here, once, as a SchemaError; the modules built from
    a valid recipe check nothing again. ``causal=False`` for encoder stacks, which causal-only
    mixers cannot serve."""
    plans = layer_plan(model, path, validator)
    _check_shared_blocks(model, plans, path, validator)
    for index, plan in enumerate(plans):
        where = (*path, "layer_types", plan.type) if plan.type else path
        if not causal and validator.component("mixer", plan.mixer["kind"], (*where, "mixer")).causal_only:
            raise SchemaError((*where, "mixer"), f"mixer {plan.mixer['kind']!r} is causal by construction and "
                                                 f"cannot serve a bidirectional (encoder) stack (layer {index})")
        empty = validator.component("mixer", plan.mixer["kind"], (*where, "mixer")).empty
        if empty and plan.ffn is None:
            raise SchemaError((*where, "ffn"), f"a layer with mixer none needs an ffn (layer {index} would do nothing)")
        if empty and plan.residual != "sequential":
            raise SchemaError((*where, "residual"), f"{plan.residual} residuals run a mixer beside the FFN; this "
                                                    f"layer has none (layer {index})")
        if plan.residual != "sequential" and plan.placement != "pre":
            raise SchemaError((*where, "residual"), f"{plan.residual} residuals wire pre-norm layers; "
                                                    f"placement is {plan.placement!r} (layer {index})")




def _check_shared_blocks(model: dict, plans: list[LayerPlan], path: tuple, validator: Validator) -> None:
    """A layer's ``shared_block`` names one of the model's ``shared_blocks`` and runs before a mixer;
    every shared block has a site, and its attention fits its input width."""
    blocks = model.get("shared_blocks") or []
    for index, plan in enumerate(plans):
        if plan.shared_block is None:
            continue
        where = (*path, "layer_types", plan.type, "shared_block") if plan.type else (*path, "shared_block")
        if plan.shared_block >= len(blocks):
            have = f"indices 0..{len(blocks) - 1}" if blocks else "the model has no shared_blocks"
            raise SchemaError(where, f"shared block {plan.shared_block} does not exist ({have}; layer {index})")
        if validator.component("mixer", plan.mixer["kind"], where).empty:
            raise SchemaError(where, f"a shared block feeds the layer's mixer; layer {index} has mixer none")
    for i, spec in enumerate(blocks):
        where = (*path, "shared_blocks", i)
        width = 2 * model["dim"] if spec["concat_embeddings"] else model["dim"]
        check_attention(spec["attention"], width, (*where, "attention"))
        position = spec["position"]
        if position is not None and _embeds(validator, position["kind"], (*where, "position")):
            raise SchemaError((*where, "position"), f"{position['kind']!r} adds to the token embeddings; a shared "
                                                    f"block's attention may use rotary or bias schemes, or none")
        if "ffn" in spec["adapters"] and spec["ffn"] is None:
            raise SchemaError((*where, "adapters"), "ffn is adapted, but the block has no ffn; drop it from adapters")
        if not any(plan.shared_block == i for plan in plans):
            raise SchemaError(where, f"shared block {i} runs in no layer; name it in a layer type "
                                     f"(shared_block: {i}) or remove it")
