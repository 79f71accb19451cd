"""One registered component in full, for ``seqzoo list KIND NAME`` (and its parameters as rows,
for ``seqzoo catalog``).

The parameters come from the same place recipes are validated against: the constructor's signature
and type hints (see ``schema.Validator.params``). The core arguments of the kind (``CORE_ARGS``)
come first in every constructor but are supplied by the core, never by a recipe, so they are shown
apart. Hints are written the way a plugin author would write them, with the numeric bounds of
``Annotated[..., Range(...)]`` spelled out (``int >= 1``), since the alias names (``PositiveInt``)
do not survive to run time.
"""
from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from ..schema import Range, SpecKind, plain, recipe_schema

if TYPE_CHECKING:  # annotations only: the registry (and torch) load with the command
    from ..registry import Component

_INDENT = "  "


@dataclasses.dataclass(frozen=True)
class Param:
    """One constructor parameter (or dataclass field): its name, type hint and default."""

    name: str
    hint: Any
    default: Any = inspect.Parameter.empty

    @property
    def required(self) -> bool:
        return self.default is inspect.Parameter.empty


@dataclasses.dataclass(frozen=True)
class Row:
    """One entry of a component's parameter list, as ``seqzoo list`` and ``seqzoo catalog`` show it:
    the key path (a section's own keys are one level in: ``("attention", "heads")``), the type hint
    as a plugin author writes it, and the default as plain data (``required`` without one)."""

    path: tuple[str, ...]
    hint: str
    default: Any = inspect.Parameter.empty

    @property
    def name(self) -> str:
        return self.path[-1]

    @property
    def required(self) -> bool:
        return self.default is inspect.Parameter.empty


def parameter_rows(component: Component) -> tuple[list[Row], list[Row]]:
    """(core arguments, recipe parameters) of a component, from its constructor's schema.

    The core arguments of its kind come without defaults (the core always passes them); a recipe
    parameter whose value is a dataclass section is followed by the section's own keys."""
    from ..interfaces import CORE_ARGS

    core = CORE_ARGS.get(component.kind, ())
    if not isinstance(component.cls, type):
        return [], []
    by_name = {p.name: p for p in parameters(component.cls.__init__)}
    core_rows = [Row((name,), format_hint(by_name.get(name, Param(name, Any)).hint)) for name in core]
    schema, skip = recipe_schema(component.cls, core)
    rows: list[Row] = []
    for param in parameters(schema):
        if param.name not in skip:
            rows += _rows(param, ())
    return core_rows, rows


def describe(component: Component) -> str:
    """The full text of one component: summary, class, aliases, origin, core arguments, recipe
    parameters with their types and defaults, and the class's own docstring."""
    from ..registry import own_doc

    kind, cls = component.kind, component.cls
    lines = [f"{kind} {component.name}" + (f": {component.summary}" if component.summary else "")]
    rows = [
        ("class", f"{cls.__module__}.{cls.__qualname__}"),
        ("aliases", ", ".join(component.aliases) or "none"),
        ("plugin", component.plugin or "unknown"),
        ("distribution", f"{component.distribution} {component.version}".strip()
         if component.distribution else "none (a local plugin)"),
    ]
    width = max(len(label) for label, _ in rows)
    lines += [""] + [f"{label:<{width}}  {value}" for label, value in rows]

    core, params = parameter_rows(component)
    if core:
        lines += ["", "core arguments (passed by the core, not recipe parameters):"]
        lines += [f"{_INDENT}{row.name}: {row.hint}" for row in core]
    lines += ["", "parameters:" if params else "parameters: none"]
    for row in params:
        default = " (required)" if row.required else f" = {row.default!r}"
        lines.append(f"{_INDENT * len(row.path)}{row.name}: {row.hint}{default}")

    lines += ["", own_doc(cls) or "(no docstring)"]
    return "\n".join(lines)


def parameters(fn: Any) -> list[Param]:
    """The keyword parameters of ``fn`` (a constructor or a dataclass) in order, as the recipe
    validator accepts them: ``self``, ``*args`` and ``**kwargs`` are not recipe keys."""
    if dataclasses.is_dataclass(fn) and isinstance(fn, type):
        hints = _hints(fn)
        return [Param(f.name, hints.get(f.name, Any), _field_default(f)) for f in dataclasses.fields(fn)
                if f.init]
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin slot such as object.__init__: nothing to show
        return []
    hints = _hints(fn)
    return [Param(name, hints.get(name, p.annotation if p.annotation is not p.empty else Any), p.default)
            for name, p in signature.parameters.items()
            if name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def _hints(fn: Any) -> dict[str, Any]:
    # A plugin's annotation that does not resolve shows as its raw string rather than failing the
    # whole description (the recipe validator reports it when the component is used).
    try:
        return typing.get_type_hints(fn, include_extras=True)
    except (NameError, AttributeError, TypeError, SyntaxError):
        return dict(getattr(fn, "__annotations__", {}) or {})


def _field_default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return inspect.Parameter.empty


def _rows(param: Param, parent: tuple[str, ...]) -> list[Row]:
    """The row of one parameter; a dataclass section's own fields follow it, one level in."""
    path = (*parent, param.name)
    default = param.default if param.required else plain(param.default)
    rows = [Row(path, format_hint(param.hint), default)]
    section = _section(param.hint)
    if section is not None and len(path) < 4:  # sections nest only a few levels in practice
        for field in parameters(section):
            rows += _rows(field, path)
    return rows


def _section(hint: Any) -> type | None:
    """The dataclass a parameter's value is a section of (``X`` or ``X | None``), if any."""
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return hint
    if typing.get_origin(hint) in (Union, types.UnionType):
        found = [a for a in typing.get_args(hint) if dataclasses.is_dataclass(a) and isinstance(a, type)]
        return found[0] if len(found) == 1 else None
    return None


def format_hint(hint: Any) -> str:
    """A type hint as a plugin author writes it: ``(int >= 1) | None``, ``Spec["norm"]``,
    ``Literal['pre', 'post']``, ``list[int]``."""
    if isinstance(hint, str):
        return hint  # an annotation that could not be resolved
    if hint is Any or hint is inspect.Parameter.empty:
        return "any"
    if hint is type(None) or hint is None:
        return "None"
    origin = typing.get_origin(hint)
    if origin is Annotated:
        base, *extras = typing.get_args(hint)
        for extra in extras:
            if isinstance(extra, SpecKind):
                return f'Spec["{extra.kind}"]'
        text = format_hint(base)
        bounds = [_bounds(e) for e in extras if isinstance(e, Range)]
        return " ".join([text, *filter(None, bounds)])
    if origin in (Union, types.UnionType):
        # A bounded member reads as one unit: ``(int >= 1) | None``, not ``int >= 1 | None``.
        parts = [format_hint(a) for a in typing.get_args(hint)]
        return " | ".join(f"({p})" if " " in p and not p.startswith(("Literal", "Spec")) else p
                          for p in parts)
    if origin is Literal:
        return f"Literal[{', '.join(repr(c) for c in typing.get_args(hint))}]"
    if origin is not None:
        args = typing.get_args(hint)
        name = getattr(origin, "__name__", str(origin))
        if not args:
            return name
        return f"{name}[{', '.join('...' if a is Ellipsis else format_hint(a) for a in args)}]"
    return getattr(hint, "__name__", str(hint))


def _bounds(bound: Range) -> str:
    """``>= 1``, ``> 0``, ``in [0.0, 1.0)``: a Range as the words a reader checks a value against."""
    if bound.lo is not None and bound.hi is not None:
        return f"in {'(' if bound.lo_open else '['}{bound.lo}, {bound.hi}{')' if bound.hi_open else ']'}"
    if bound.lo is not None:
        return f"{'>' if bound.lo_open else '>='} {bound.lo}"
    if bound.hi is not None:
        return f"{'<' if bound.hi_open else '<='} {bound.hi}"
    return ""
