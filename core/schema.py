"""Typed recipe schemas: plain YAML values checked against constructor type hints.

A component's constructor *is* its schema. The validator reads its signature and type hints and
checks a recipe section against them before any tensor exists, filling in defaults. Supported hints:
``bool``, ``int``, ``float``, ``str``, ``Literal[...]``, ``X | None``, unions, ``list[X]``,
``tuple[X, ...]``, ``dict[str, X]``, frozen dataclasses (nested sections), ``Annotated[X, Range(...)]``,
``Annotated[X, Check(rule)]`` and ``Spec["kind"]`` (another registered component, by name or
``{kind: name, **params}``).
"""
from __future__ import annotations

import dataclasses
import inspect
import math
import re
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union

from .errors import closest

_SCIENTIFIC = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")

Path = tuple  # a key path such as ("model", "attention", "heads")


class SchemaError(Exception):
    """A value that does not fit its schema, at ``path`` (formatted later with file and line)."""

    def __init__(self, path: Path, message: str) -> None:
        super().__init__(message)
        self.path = tuple(path)
        self.message = message


_PLAIN_KEY = re.compile(r"[A-Za-z0-9_\-]+")


def dotted(path: Path) -> str:
    """``model.attention.heads``; keys that are not plain words are quoted (``model.'a b'``) so a
    message stays one readable line."""
    return ".".join(p if isinstance(p, str) and _PLAIN_KEY.fullmatch(p) else repr(p) for p in path)


@dataclass(frozen=True)
class Range:
    """A numeric bound for ``Annotated[int, Range(lo=1)]``; ``lo``/``hi`` inclusive unless open."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False

    def check(self, value: float) -> str | None:
        if self.lo is not None and (value < self.lo or (self.lo_open and value == self.lo)):
            return f"must be {'>' if self.lo_open else '>='} {self.lo}"
        if self.hi is not None and (value > self.hi or (self.hi_open and value == self.hi)):
            return f"must be {'<' if self.hi_open else '<='} {self.hi}"
        return None


@dataclass(frozen=True)
class Check:
    """A rule for ``Annotated[X, Check(rule)]`` that no type says (a device name torch knows):
    ``rule(value)`` returns what is wrong with the value, or None."""

    rule: typing.Callable[[Any], str | None]


@dataclass(frozen=True)
class SpecKind:
    kind: str


class Spec:
    """``Spec["position"]``: a registered component of that kind, by name or as a mapping
    ``{kind: NAME, **params}``. Validated to ``{"kind": NAME, **params with defaults}``.

    What a recipe writes; what a component's constructor receives for such a parameter is a
    factory of that component (``seqzoo.registry.Registry.create``): the constructor calls it with
    the kind's core arguments, as many times as it needs parts, and never asks the registry."""

    def __class_getitem__(cls, kind: str):
        return Annotated[Union[str, dict], SpecKind(kind)]


def spec_kind(hint: Any) -> str | None:
    """The component kind a ``Spec[...]`` hint names (also inside ``X | None``), or None."""
    if typing.get_origin(hint) is Annotated:
        return next((e.kind for e in typing.get_args(hint)[1:] if isinstance(e, SpecKind)), None)
    if typing.get_origin(hint) in (Union, types.UnionType):
        return next((k for a in typing.get_args(hint) if (k := spec_kind(a)) is not None), None)
    return None


def spec_list_kind(hint: Any) -> str | None:
    """The component kind of a ``list[Spec[...]]`` hint (also inside ``X | None``), or None."""
    if typing.get_origin(hint) in (Union, types.UnionType):
        return next((k for a in typing.get_args(hint) if (k := spec_list_kind(a)) is not None), None)
    if typing.get_origin(hint) in (list, tuple) and typing.get_args(hint):
        return spec_kind(typing.get_args(hint)[0])
    return None


class Configured:
    """A component whose recipe parameters are one dataclass, ``Config``, shared with whatever else
    reads them (attention's ``Config`` is also the model's ``attention:`` section). The recipe's keys
    are the dataclass's fields; the constructor receives ``(*core_args, config, **factories)``,
    one factory for each ``Spec`` field that is set, named after the field."""

    Config: typing.ClassVar[type]


def recipe_schema(cls: type, core_args: tuple[str, ...]) -> tuple[Any, tuple[str, ...]]:
    """What a component's recipe parameters are checked against, and the names to skip there: its
    ``Config`` dataclass (``Configured``), else its constructor after the kind's core arguments."""
    if issubclass(cls, Configured):
        return cls.Config, ()
    return cls.__init__, core_args


PositiveInt = Annotated[int, Range(lo=1)]
NonNegativeInt = Annotated[int, Range(lo=0)]
PositiveFloat = Annotated[float, Range(lo=0, lo_open=True)]
NonNegativeFloat = Annotated[float, Range(lo=0.0)]
Probability = Annotated[float, Range(lo=0.0, hi=1.0, hi_open=True)]  # dropout: 1.0 would zero all
UnitInterval = Annotated[float, Range(lo=0.0, hi=1.0)]
# Structural sizes are bounded so that a typo like 10**12 is an error, not a hang or an
# allocation attempt: widths, vocabularies and lengths up to 2**24, depths and head counts up to 1024.
Size = Annotated[int, Range(lo=1, hi=2**24)]
Depth = Annotated[int, Range(lo=1, hi=1024)]


class Validator:
    """Checks values against hints. ``resolve_component(kind, name, path)`` returns the class of a
    registered component (raising SchemaError for unknown names); ``core_args(kind)`` the
    constructor arguments the core supplies. ``components`` collects ``(path, kind, name)`` of every
    component the recipe names, for provenance."""

    def __init__(self, resolve_component, core_args) -> None:
        self.resolve_component = resolve_component
        self.core_args = core_args
        self.components: list[tuple[Path, str, str]] = []
        #: When a list, the errors of the top-level keys and of each section's own keys are
        #: collected here rather than raised, so a recipe's mistakes are reported together (like
        #: a compiler); an error inside a key's value is that key's one error.
        self.collected: list[SchemaError] | None = None

    def _collects(self, path: Path) -> bool:
        return self.collected is not None and len(path) <= 1

    # -- sections -------------------------------------------------------------------------------
    def params(self, fn, values: Any, path: Path, skip: tuple[str, ...] = ()) -> dict:
        """Check a mapping of keyword arguments for ``fn``; return it with defaults filled in."""
        if values is None:
            values = {}
        if not isinstance(values, dict):
            raise SchemaError(path, f"expected a mapping, got {describe(values)}")
        sig = inspect.signature(fn)
        hints = typing.get_type_hints(fn, include_extras=True)
        accepted = {
            name: p for name, p in sig.parameters.items()
            if name not in ("self", *skip)
            and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        }
        collect = self._collects(path)
        for key in values:
            try:
                if not isinstance(key, str):
                    raise SchemaError(path, f"keys must be strings, got {describe(key)}")
                if key not in accepted:
                    hint = closest(key, accepted)
                    fix = f"did you mean {hint!r}?" if hint else f"allowed keys: {', '.join(accepted) or 'none'}"
                    raise SchemaError((*path, key), f"unknown key {key!r}; {fix}")
            except SchemaError as error:
                if not collect:
                    raise
                self.collected.append(error)
        out = {}
        for name, param in accepted.items():
            hint = hints.get(name, Any)
            try:
                if name in values:
                    out[name] = self.value(values[name], hint, (*path, name))
                elif param.default is inspect.Parameter.empty:
                    raise SchemaError((*path, name), f"missing required key {name!r}")
                else:
                    out[name] = self.value(plain(param.default), hint, (*path, name))
            except SchemaError as error:
                if not collect:
                    raise
                self.collected.append(error)
                out[name] = None
        return out

    def spec(self, kind: str, value: Any, path: Path) -> dict:
        if isinstance(value, str):
            name, params = value, {}
        elif isinstance(value, dict):
            if "kind" not in value:
                raise SchemaError(path, f"a {kind} mapping needs a 'kind' key naming the {kind}")
            params = dict(value)
            name = params.pop("kind")
            if not isinstance(name, str):
                raise SchemaError((*path, "kind"), f"expected a {kind} name, got {describe(name)}")
        else:
            raise SchemaError(path, f"expected a {kind} name or a mapping with 'kind', got {describe(value)}")
        cls, canonical = self.resolve_component(kind, name, path if isinstance(value, str) else (*path, "kind"))
        self.components.append((tuple(path), kind, canonical))
        fn, skip = recipe_schema(cls, self.core_args(kind))
        return {"kind": canonical, **self.params(fn, params, path, skip)}

    def component(self, kind: str, name: str, path: Path) -> type:
        """The class of the registered component ``kind/name`` (a SchemaError at ``path`` if none)."""
        return self.resolve_component(kind, name, path)[0]

    # -- values ---------------------------------------------------------------------------------
    def value(self, value: Any, hint: Any, path: Path) -> Any:
        origin = typing.get_origin(hint)
        if origin is Annotated:
            base, *extras = typing.get_args(hint)
            for extra in extras:
                if isinstance(extra, SpecKind):
                    return self.spec(extra.kind, value, path)
            value = self.value(value, base, path)
            for extra in extras:
                if isinstance(extra, Range) and value is not None:
                    problem = extra.check(value)
                    if problem:
                        raise SchemaError(path, f"{value!r} is out of range: {problem}")
                if isinstance(extra, Check) and value is not None:
                    problem = extra.rule(value)
                    if problem:
                        raise SchemaError(path, problem)
            return value
        if hint is Any or hint is object:
            return value
        if origin in (Union, types.UnionType):
            options = typing.get_args(hint)
            if value is None:
                if type(None) in options:
                    return None
                raise SchemaError(path, f"a value is required ({describe_hint(hint)}), got null")
            errors = []
            for option in options:
                if option is type(None):
                    continue
                try:
                    return self.value(value, option, path)
                except SchemaError as error:
                    if error.path != tuple(path):  # the value fit the option's shape; report inside
                        raise
                    errors.append(error)
            if len(errors) == 1:
                raise errors[0]
            # A suggestion from one option ("did you mean ...") beats a list of every option.
            hinted = [e for e in errors if "did you mean" in e.message]
            if hinted:
                raise hinted[-1]
            raise SchemaError(path, f"expected {describe_hint(hint)}, got {describe(value)}")
        if origin is Literal:
            choices = typing.get_args(hint)
            if value in choices and type(value) in {type(c) for c in choices}:
                return value
            names = ", ".join(repr(c) for c in choices)
            match = closest(str(value), [str(c) for c in choices]) if isinstance(value, str) else None
            fix = f"; did you mean {match!r}?" if match else ""
            raise SchemaError(path, f"{value!r} is not one of {names}{fix}")
        if origin in (list, tuple):
            if not isinstance(value, (list, tuple)):
                raise SchemaError(path, f"expected a list, got {describe(value)}")
            args = typing.get_args(hint)
            item = args[0] if args else Any
            if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
                if len(value) != len(args):
                    raise SchemaError(path, f"expected {len(args)} items, got {len(value)}")
                return [self.value(v, a, (*path, i)) for i, (v, a) in enumerate(zip(value, args))]
            return [self.value(v, item, (*path, i)) for i, v in enumerate(value)]
        if origin is dict or hint is dict:
            if not isinstance(value, dict):
                raise SchemaError(path, f"expected a mapping, got {describe(value)}")
            args = typing.get_args(hint)
            item = args[1] if args else Any
            if args and args[0] is str:
                # Keys as text: YAML reads ``{0: ...}`` with an int key, a checkpoint's JSON with a
                # string one, and the two must resolve to the same recipe.
                value = {_text_key(k, (*path, k)): v for k, v in value.items()}
            return {k: self.value(v, item, (*path, k)) for k, v in value.items()}
        if dataclasses.is_dataclass(hint):
            return self.params(hint, value, path)
        if hint is bool:
            if isinstance(value, bool):
                return value
            raise SchemaError(path, f"expected true or false, got {describe(value)}")
        if hint is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            if isinstance(value, float) and value.is_integer() and math.isfinite(value):
                return int(value)
            raise SchemaError(path, f"expected an integer, got {describe(value)}")
        if hint is float:
            if isinstance(value, str) and _SCIENTIFIC.fullmatch(value.strip()):
                value = float(value)  # YAML 1.1 reads 1e-3 (no dot) as a string; users mean a number
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                if not math.isfinite(value):
                    raise SchemaError(path, f"expected a finite number, got {value!r}")
                return float(value)
            raise SchemaError(path, f"expected a number, got {describe(value)}")
        if hint is str:
            if isinstance(value, str):
                return value
            raise SchemaError(path, f"expected a string, got {describe(value)}")
        if isinstance(hint, type) and isinstance(value, hint):
            return value
        raise SchemaError(path, f"expected {describe_hint(hint)}, got {describe(value)}")


def _text_key(key: Any, path: Path) -> str:
    if isinstance(key, str):
        return key
    if isinstance(key, int) and not isinstance(key, bool):
        return str(key)
    raise SchemaError(path, f"expected a name or a number as the key, got {describe(key)}")


def plain(value: Any) -> Any:
    """Dataclass defaults as plain mappings, so resolved recipes are YAML/JSON data."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return value


def instantiate(value: Any, hint: Any) -> Any:
    """Turn validated plain data into what a constructor expects: dataclass sections become
    dataclass instances; everything else (component specs included) stays as it is."""
    origin = typing.get_origin(hint)
    if origin is Annotated:
        base, *extras = typing.get_args(hint)
        if any(isinstance(e, SpecKind) for e in extras):
            return value
        return instantiate(value, base)
    if value is None:
        return None
    if origin in (Union, types.UnionType):
        for option in typing.get_args(hint):
            if dataclasses.is_dataclass(option) and isinstance(value, dict):
                return instantiate(value, option)
        return value
    if dataclasses.is_dataclass(hint) and isinstance(value, dict):
        hints = typing.get_type_hints(hint, include_extras=True)
        return hint(**{k: instantiate(v, hints.get(k, Any)) for k, v in value.items()})
    return value


def call_with(fn, params: dict, *args):
    """Call ``fn(*args, **params)``, turning dataclass sections into instances first."""
    hints = typing.get_type_hints(fn.__init__ if isinstance(fn, type) else fn, include_extras=True)
    return fn(*args, **{k: instantiate(v, hints.get(k, Any)) for k, v in params.items()})


def describe(value: Any) -> str:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({type(value).__name__})"


def describe_hint(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin is Annotated:
        kinds = [e.kind for e in typing.get_args(hint)[1:] if isinstance(e, SpecKind)]
        return f"a {kinds[0]} name or mapping" if kinds else describe_hint(typing.get_args(hint)[0])
    if origin in (Union, types.UnionType):
        return " or ".join(describe_hint(a) for a in typing.get_args(hint))
    if origin is Literal:
        return "one of " + ", ".join(repr(c) for c in typing.get_args(hint))
    if hint is type(None):
        return "null"
    return {bool: "true/false", int: "an integer", float: "a number", str: "a string",
            dict: "a mapping", list: "a list"}.get(hint, getattr(hint, "__name__", str(hint)))
