"""Per-layer patterns, and the one place that turns a model recipe's specs into built modules.

A uniform stack is ``layers: N``. A heterogeneous one names layer types and a repeating pattern:

    layers: 12
    layer_types:
      local:  {attention: {window: 512}, position: {base: 10000}}
      global: {position: {base: 1000000}}
    pattern: [local, local, local, local, local, global]   # repeats; layer i is pattern[i % 6]
    layer_overrides: {0: global, 7: {ffn: {hidden: 512}}}  # per index: a type, or parts

A layer type overrides any per-layer part of the model section: ``mixer``, ``attention`` (window,
score, softcap, QK-norm, ...), ``position`` (another scheme, ``none`` for NoPE layers, a RoPE base
or scaling of its own), ``ffn``, ``norm``, ``placement`` and ``residual``; and ``attn_norm: false``
drops the norm around the mixer (ModernBERT's layer 0, whose input is the embedding norm's output).
A mapping is merged into the model's value (a different ``kind`` replaces it); a name replaces it.
Layers that end up with the same position scheme share one instance, so its per-forward work is
done once.

``layer_plan`` validates all of that (errors name the layer type or index and the key) and
``build_stack`` builds a ``TransformerStack`` from the plan: the model plugins call these and
nothing else, and the nn classes receive built modules.
"""
from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

import yaml
from torch import nn

from ..errors import closest
from ..interfaces import CORE_ARGS, PositionScheme
from ..registry import registry
from ..schema import SchemaError, Validator, dotted, instantiate
from .attention import AttentionConfig, MultiHeadAttention, check_attention
from .blocks import Placement, Residual, TransformerBlock, TransformerStack

ATTENTION = {"kind": "attention"}  # the mixer of a layer whose mixer is null: the attention: section

#: The model-section keys a layer type may override.
LAYER_KEYS = ("mixer", "attention", "position", "ffn", "norm", "placement", "residual", "attn_norm")
#: Their values when a model section does not have the key (an encoder–decoder has no residual:;
#: ``attn_norm`` is per layer only).
DEFAULTS = {"mixer": None, "residual": "sequential", "placement": "pre", "attn_norm": True}


@dataclass(frozen=True)
class LayerPlan:
    """The resolved parts of one layer: validated specs (``{kind: name, **params}``), the attention
    section as an ``AttentionConfig``, and the layer type's name (None for the model's defaults).
    ``attn_norm``: whether the block has its norm around the mixer (``TransformerBlock.attn_norm``)."""

    type: str | None
    mixer: dict
    attention: AttentionConfig | None  # None: the model has no attention: section, and no layer attends
    position: dict
    ffn: dict | None  # None: no feed-forward sublayer
    norm: dict
    placement: Placement
    residual: Residual
    attn_norm: bool = True


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


def _validator() -> Validator:
    return Validator(registry().resolve, lambda kind: CORE_ARGS.get(kind, ()))


def layer_plan(model: dict, path: tuple = ("model",), validator: Validator | None = None) -> list[LayerPlan]:
    """The parts of every layer of a (validated) model section, in order. Raises SchemaError at
    the layer type, index and key that is wrong. ``validator`` records the components it meets
    (recipe validation passes its own, for provenance)."""
    validator = validator or _validator()
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
    attention = None
    if part["attention"] is not None:
        attention = validator.params(AttentionConfig, part["attention"], at("attention"))
        check_attention(attention, dim, at("attention"))
    position = validator.spec("position", part["position"], at("position"))
    if "position" in override and _embeds(position["kind"]) and part["position"] != base["position"]:
        raise SchemaError(at("position"), f"{position['kind']!r} adds to the token embeddings, which every "
                                          f"layer shares; a layer type may use rotary or bias schemes, or none")
    if part["mixer"] is None:  # attention, configured by the attention: section (recorded there)
        mixer = _attention_defaults(validator, at("mixer"))
    else:
        mixer = validator.spec("mixer", part["mixer"], at("mixer"))
    if mixer["kind"] == "attention" and mixer != _attention_defaults(validator, at("mixer")):
        raise SchemaError(at("mixer"), "an attention mixer takes its parameters from the attention: section; "
                                       "write mixer: attention and set heads, window, ... under attention:")
    if mixer["kind"] == "attention" and attention is None:
        layer = f"{dotted(where)}'s" if where != model_path else "the layers'"
        raise SchemaError(at("attention"), f"missing required key 'attention': {layer} mixer is attention (the "
                                           f"default when mixer is null); give attention: {{heads: H, ...}} or "
                                           f"another mixer")
    return LayerPlan(
        type=None, mixer=mixer, attention=None if attention is None else instantiate(attention, AttentionConfig),
        position=position,
        ffn=None if part["ffn"] is None else validator.spec("ffn", part["ffn"], at("ffn")),
        norm=validator.spec("norm", part["norm"], at("norm")),
        placement=validator.value(part["placement"], Placement, at("placement")),
        residual=validator.value(part["residual"], Residual, at("residual")),
        attn_norm=validator.value(part["attn_norm"], bool, at("attn_norm")))


def _attention_defaults(validator: Validator, where: tuple) -> dict:
    """The attention mixer's spec with every default, without recording it as a component."""
    seen = len(validator.components)
    spec = validator.spec("mixer", ATTENTION, where)
    del validator.components[seen:]
    return spec


def _embeds(kind: str) -> bool:
    cls = registry().get("position", kind).cls
    return cls.embed is not PositionScheme.embed


def check_layers(model: dict, path: tuple, validator: Validator, *, causal: bool = True) -> None:
    """Recipe validation of a model section's per-layer settings (a ``check_recipe`` helper);
    ``causal=False`` for encoder stacks, which causal-only mixers cannot serve."""
    plans = layer_plan(model, path, validator)
    if model.get("layer_overrides"):
        # Index keys as text: YAML gives ints, a checkpoint's JSON gives strings, and a resumed
        # run compares the two recipes.
        model["layer_overrides"] = {str(int(key)): value for key, value in model["layer_overrides"].items()}
    for index, plan in enumerate(plans):
        where = (*path, "layer_types", plan.type) if plan.type else path
        if not causal and registry().get("mixer", plan.mixer["kind"]).cls.causal_only:
            raise SchemaError((*where, "mixer"), f"mixer {plan.mixer['kind']!r} is causal by construction and "
                                                 f"cannot serve a bidirectional (encoder) stack (layer {index})")
        if plan.residual != "sequential" and plan.placement != "pre":
            raise SchemaError((*where, "residual"), f"{plan.residual} residuals wire pre-norm layers; "
                                                    f"placement is {plan.placement!r} (layer {index})")


# -- building ------------------------------------------------------------------------------------
def make(kind: str, spec: str | dict, *core_args: Any, **kwargs: Any) -> nn.Module:
    """A registered component from its spec: the one way builders turn a recipe spec into a module."""
    return registry().create(kind, spec, *core_args, **kwargs)


def cell_factory(spec: str | dict) -> Callable[[int, int], nn.Module]:
    """``make(input_size, hidden_size)`` for the registered cell a spec names (a stack's cells)."""
    return lambda input_size, hidden_size: make("cell", spec, input_size, hidden_size)


def build_mixer(dim: int, plan: LayerPlan) -> nn.Module:
    """The layer's token mixer: attention from the ``attention:`` section, or a registered mixer."""
    if plan.mixer["kind"] == "attention":
        return build_attention(dim, plan.attention)
    return make("mixer", plan.mixer, dim)


def attention_parts(dim: int, config: AttentionConfig) -> tuple[nn.Module, nn.Module | None, nn.Module | None]:
    """The score and the QK norms (or None) an ``attention:`` section names."""
    heads, head_dim = config.heads, config.head_dim or dim // config.heads
    kv_heads = config.kv_heads or heads
    score = make("score", config.score, query_dim=head_dim, key_dim=head_dim, heads=heads)
    if config.qk_norm is None:
        return score, None, None
    whole = config.qk_norm_scope == "projection"  # OLMo 2 normalises all heads' features together
    return (score, make("norm", config.qk_norm, heads * head_dim if whole else head_dim),
            make("norm", config.qk_norm, kv_heads * head_dim if whole else head_dim))


def build_attention(dim: int, config: AttentionConfig, *, cross: bool = False,
                    memory_dim: int | None = None) -> MultiHeadAttention:
    """Multi-head attention with its score and QK norms built from the section's specs."""
    score, q_norm, k_norm = attention_parts(dim, config)
    return MultiHeadAttention.from_config(dim, config, score=score, q_norm=q_norm, k_norm=k_norm,
                                          cross=cross, memory_dim=memory_dim)


def build_stack(model: dict, *, layers_key: str = "layers", causal: bool, cross: bool = False,
                head_dim: int | None = None) -> TransformerStack:
    """A ``TransformerStack`` for a model section (its ``dim``, ``max_seq_len``, ``dropout``,
    ``embed_norm`` and per-layer parts). ``layers_key`` names the depth key (an encoder–decoder
    has two); ``cross`` gives every block cross-attention to an encoder memory."""
    dim, max_seq_len = model["dim"], model["max_seq_len"]
    section = {**model, "layers": model[layers_key]}
    plans = layer_plan(section)
    # One instance per distinct scheme, its work shared; the model's own comes first, as the
    # stack's ``position`` (the one that adds to embeddings and bounds the length).
    schemes: dict[str, PositionScheme] = {}
    layer_scheme = []
    base = model["attention"]
    for spec, config, mixer in [(model["position"], base, None),
                                *((plan.position, plan.attention, plan.mixer) for plan in plans)]:
        own = registry().get("mixer", mixer["kind"]).cls.position_dims(mixer, dim) if mixer else None
        if config is None:  # no layer attends: the scheme (none, or an absolute table) sees one wide head
            config = AttentionConfig(heads=1)
        d, heads = own or (config.head_dim or dim // config.heads, config.heads)
        key = repr((sorted(spec.items()) if isinstance(spec, dict) else spec, d, heads))
        if key not in schemes:
            schemes[key] = make("position", spec, dim, d, heads, max_seq_len)
        layer_scheme.append(list(schemes).index(key))
    layer_scheme = layer_scheme[1:]
    blocks = []
    for plan in plans:
        norm = plan.norm
        cross_attn = build_attention(dim, plan.attention, cross=True) if cross else None
        ffn = make("ffn", plan.ffn, dim) if plan.ffn is not None else None
        blocks.append(TransformerBlock(build_mixer(dim, plan), ffn,
                                       lambda n=norm: make("norm", n, dim), placement=plan.placement,
                                       residual=plan.residual, dropout=model.get("dropout", 0.0),
                                       cross_attn=cross_attn, attn_norm=plan.attn_norm))
    # Post-norm blocks end in a norm already; every other placement needs one at the top.
    top = plans[-1]
    final_norm = make("norm", top.norm, dim) if top.placement != "post" else None
    embed_norm = make("norm", model["embed_norm"], dim) if model.get("embed_norm") else None
    position, *others = schemes.values()
    return TransformerStack(blocks, position, causal=causal, layer_positions=others, layer_scheme=layer_scheme,
                            embed_norm=embed_norm, final_norm=final_norm, dropout=model.get("dropout", 0.0))


# -- showing -------------------------------------------------------------------------------------
def describe_layout(model: dict) -> str | None:
    """``layers 0-4 local (window 512, rope 1e4) · 5 global (rope 1e6) ×4`` for a patterned model
    section, None for a uniform one."""
    pattern = model.get("pattern")
    if not pattern:
        return None
    types = model.get("layer_types") or {}
    overrides = model.get("layer_overrides") or {}
    layers = model["layers"]
    names = [pattern[i % len(pattern)] for i in range(layers)]
    notes = [_summary(types.get(n) or {}) for n in names]
    for key, value in overrides.items():
        index = int(key)
        if isinstance(value, str):
            names[index], notes[index] = value, _summary(types.get(value) or {})
        else:
            notes[index] = ", ".join(filter(None, [notes[index], _summary(value)]))
    whole = layers % len(pattern) == 0  # else the last period is cut short (Gemma 3's 26 = 4·6 + 2)
    span = len(pattern) if not overrides and whole else layers
    runs = []
    start = 0
    for i in range(1, span + 1):
        if i == span or (names[i], notes[i]) != (names[start], notes[start]):
            where = str(start) if i - 1 == start else f"{start}-{i - 1}"
            note = notes[start] if notes[start] not in ("", names[start]) else ""
            runs.append(f"{where} {names[start]}" + (f" ({note})" if note else ""))
            start = i
    repeat = f" ×{layers // len(pattern)}" if not overrides and whole and layers > len(pattern) else ""
    return "layers " + " · ".join(runs) + repeat


def _summary(override: dict) -> str:
    """What a layer type changes, in a few words: window 512, rope 1e4, nope, mixer recurrent."""
    words = []
    for key, value in override.items():
        if key == "position":
            kind = value if isinstance(value, str) else value.get("kind")
            if kind == "none":
                words.append("nope")
            elif isinstance(value, dict) and "base" in value:
                words.append(f"{kind or 'rope'} {value['base']:g}")
            else:
                words.append(f"position {kind}")
            continue
        if not isinstance(value, dict):
            words.append(f"{key} {value}")
            continue
        if "kind" in value:
            words.append(f"{key} {value['kind']}")
        words += [f"{k} {_flow(v)}" for k, v in value.items() if k != "kind"]
    return ", ".join(words)


def _flow(value: Any) -> str:
    """A recipe value as a recipe writes it: 512, 1e+06, {kind: swiglu, hidden: 64} (YAML's flow
    style, not a Python dict)."""
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (dict, list)):
        return yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=1 << 16).strip()
    return str(value)
