"""The registry's records: a ``Component`` (one registered variant), a ``Plugin`` (where components
came from and how loading went) and the ``Registry`` that holds them, checks them and builds them."""
from __future__ import annotations

import functools
import inspect
import re
import typing
import warnings
from dataclasses import dataclass, field
from typing import Any

import pluggy

from ..errors import ConfigError, PluginWarning, RegistryError, unknown_name
from ..interfaces import BASES, CORE_ARGS
from ..schema import Configured, SchemaError, Validator, call_with, instantiate, spec_kind, spec_list_kind
from .settings import strict


@dataclass(frozen=True)
class Component:
    """One registered variant. Plugins fill the first five fields; the registry stamps the rest."""

    kind: str
    name: str
    cls: type
    aliases: tuple[str, ...] = ()
    summary: str = ""
    plugin: str = ""
    distribution: str = ""
    version: str = ""

    @property
    def origin(self) -> str:
        """``seqzoo 0.1.0``, ``seqzoo-acme 1.2.0``, or ``local /path/to/plugin.py``."""
        if self.distribution:
            return f"{self.distribution} {self.version}".strip()
        return f"local {self.plugin}" if self.plugin else ""


@dataclass
class Plugin:
    """One plugin the registry has seen: where it came from, what it provides, or why it was not
    loaded. ``status`` is ``loaded``, ``skipped`` (it failed; ``reason`` says why) or ``disabled``."""

    name: str
    source: str  # "built-in" | "entry point" | "local"
    distribution: str = ""
    version: str = ""
    hooks: tuple[str, ...] = ()
    components: list[Component] = field(default_factory=list)
    status: str = "loaded"
    reason: str = ""

    @property
    def label(self) -> str:
        """How messages name it: ``plugin 'acme' (seqzoo-acme 1.2.0)`` or ``plugin 'x.py' (local)``."""
        where = f"{self.distribution} {self.version}".strip() if self.distribution else "local"
        return f"plugin {self.name!r} ({where})"

    @property
    def message(self) -> str:
        """The one line that reports a skipped plugin."""
        return f"{self.label} skipped: {self.reason}"


@dataclass
class Registry:
    """Every component known to this process, by kind and name (aliases included), and every plugin
    that was loaded, skipped or disabled on the way (``plugins``, ``problems``)."""

    manager: pluggy.PluginManager
    components: dict[tuple[str, str], Component] = field(default_factory=dict)
    aliases: dict[tuple[str, str], str] = field(default_factory=dict)
    plugins: dict[str, Plugin] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def report(self, message: str) -> None:
        """A plugin problem: a ``PluginWarning`` (the CLI prints it as one line), or a RegistryError
        under SEQZOO_STRICT_PLUGINS=1."""
        self.problems.append(message)
        if strict():
            raise RegistryError(message)
        warnings.warn(message, PluginWarning, stacklevel=2)

    def add(self, component: Component) -> bool:
        """Register one stamped record; True if it was added.

        A record that breaks its kind's interface, or whose ``kind/name`` is taken (the first one
        registered is kept, so built-ins always win), is reported naming both origins and skipped.
        """
        where = f"{_label(component)}: {component.kind} {component.name!r} rejected"
        try:
            _check_component(component)
        except RegistryError as error:
            self.report(f"{where}: {error}")
            return False
        key = (component.kind, component.name)
        taken = self.components.get(key)
        if taken is None and key in self.aliases:
            taken = self.components[(component.kind, self.aliases[key])]
        if taken is not None:
            self.report(f"{where}: the name is taken by {component.kind} {taken.name!r} from "
                        f"{_label(taken)}, which is kept; rename one of them")
            return False
        self.components[key] = component
        for alias in component.aliases:
            owner = self.aliases.get((component.kind, alias)) or (
                alias if (component.kind, alias) in self.components else None)
            if owner is None:
                self.aliases[(component.kind, alias)] = component.name
            else:
                self.report(f"{_label(component)}: alias {alias!r} of {component.kind} "
                            f"{component.name!r} ignored: it already names {component.kind} {owner!r}")
        return True

    def kinds(self) -> list[str]:
        return sorted({kind for kind, _ in self.components})

    def list(self, kind: str | None = None) -> list[Component]:
        """Components of one kind (or all), sorted by kind and name."""
        return sorted(
            (c for (k, _), c in self.components.items() if kind is None or k == kind),
            key=lambda c: (c.kind, c.name),
        )

    def names(self, kind: str) -> list[str]:
        return [c.name for c in self.list(kind)]

    def get(self, kind: str, name: str) -> Component:
        """The component ``kind/name`` (or an alias of it); unknown names suggest the closest."""
        key = (kind, name)
        if key in self.components:
            return self.components[key]
        if key in self.aliases:
            return self.components[(kind, self.aliases[key])]
        if kind not in {k for k, _ in self.components}:
            raise RegistryError(unknown_name("component kind", kind, self.kinds()))
        raise RegistryError(unknown_name(kind, name, self.names(kind), plugin_hint=True))

    def create(self, kind: str, name_or_spec: str | dict, /, *core_args: Any, **kwargs: Any):
        """Build a component from a name or a ``{kind: name, **params}`` spec.

        Core arguments go positionally or by keyword (``query_dim=64, key_dim=64, heads=8``); recipe
        parameters come from the spec. The spec is validated against the constructor first.
        """
        validator = Validator(self.resolve, lambda k: CORE_ARGS.get(k, ()))
        try:
            spec = validator.spec(kind, name_or_spec, (kind,))
        except SchemaError as error:
            raise RegistryError(f"{'.'.join(map(str, error.path))}: {error.message}") from None
        params = dict(spec)
        component = self.get(kind, params.pop("kind"))
        core = CORE_ARGS.get(kind, ())
        missing = [a for a in core[len(core_args):] if a not in kwargs]
        if missing:
            raise TypeError(f"creating {kind} {component.name!r} needs core arguments {missing}")
        ordered = list(core_args) + [kwargs.pop(a) for a in core[len(core_args):]]
        try:
            if issubclass(component.cls, Configured):  # one dataclass of parameters, then its parts' factories
                config = instantiate(params, component.cls.Config)
                return component.cls(*ordered, config,
                                     **self.factories(component.cls.Config, params, only_specs=True), **kwargs)
            return call_with(component.cls, {**self.factories(component.cls.__init__, params), **kwargs}, *ordered)
        except ConfigError as error:
            if error.spec is None:  # the innermost component that refused: its spec says where it was written
                error.spec = (kind, spec)
            raise

    def factories(self, schema: Any, params: dict, *, only_specs: bool = False) -> dict:
        """``params`` with every ``Spec[kind]`` parameter's spec (per ``schema``'s hints: a
        constructor or a dataclass) turned into a factory of that component (``create`` bound to
        this registry), so a constructor builds its parts without asking for the registry, and a
        test can hand it any ``nn.Module`` factory instead. ``only_specs``: just the factories."""
        hints = typing.get_type_hints(schema, include_extras=True)
        out = {} if only_specs else dict(params)
        for name, value in params.items():
            kind, many = spec_kind(hints.get(name)), spec_list_kind(hints.get(name))
            if kind is not None and value is not None:
                out[name] = functools.partial(self.create, kind, value)
            elif many is not None and value is not None:  # list[Spec[kind]]: a factory per entry
                out[name] = [functools.partial(self.create, many, item) for item in value]
        return out

    def resolve(self, kind: str, name: str, path) -> tuple[type, str]:
        """For the schema validator: (class, canonical name) or a SchemaError at ``path``."""
        try:
            component = self.get(kind, name)
        except RegistryError as error:
            raise SchemaError(path, str(error)) from None
        return component.cls, component.name


def _label(component: Component) -> str:
    where = f"{component.distribution} {component.version}".strip() if component.distribution else "local"
    return f"plugin {component.plugin!r} ({where})"


def _check_component(component: Component) -> None:
    """Reject records that would break the core's contract (the message says why)."""
    if not isinstance(component.kind, str) or not re.fullmatch(r"[A-Za-z_][\w.-]*", component.kind):
        raise RegistryError(f"kind must be a word such as 'score', got {component.kind!r}")
    if not isinstance(component.name, str) or not re.fullmatch(r"[A-Za-z0-9_][\w.-]*", component.name):
        raise RegistryError(f"name must be a word (letters, digits, _ . -), got {component.name!r}")
    if not all(isinstance(a, str) and a for a in component.aliases):
        raise RegistryError(f"aliases must be non-empty strings, got {component.aliases!r}")
    if not isinstance(component.summary, str) or "\n" in component.summary:
        raise RegistryError(f"summary must be one line of text, got {component.summary!r}")
    if not isinstance(component.cls, type):
        raise RegistryError(f"expected a class, got {component.cls!r}")
    base = BASES.get(component.kind)
    if base is not None and not issubclass(component.cls, base):
        raise RegistryError(f"{component.cls.__name__} must subclass {base.__name__}")
    core = CORE_ARGS.get(component.kind, ())
    if core:
        params = [p for p in inspect.signature(component.cls.__init__).parameters if p != "self"]
        if tuple(params[: len(core)]) != core:
            raise RegistryError(
                f"constructor must start with the core arguments {', '.join(core)}; "
                f"it starts with {', '.join(params[: len(core)]) or 'nothing'}"
            )
