"""The component registry: one pluggy PluginManager, one hook, every variant a record.

Built-in plugins (every module under ``seqzoo.plugins.<kind>``) are registered first, through the
same ``seqzoo_components`` hook third-party plugins use. The registry is built once per process, on
first use, so ``import seqzoo`` stays cheap.
"""
from __future__ import annotations

import importlib
import inspect
import pkgutil
import threading
from dataclasses import dataclass, field
from typing import Any

import pluggy

from . import hookspecs
from .errors import RegistryError, unknown_name
from .interfaces import BASES, CORE_ARGS


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
        return f"{self.distribution} {self.version}".strip() or self.plugin


@dataclass
class Registry:
    """Every component known to this process, by kind and name (aliases included)."""

    manager: pluggy.PluginManager
    components: dict[tuple[str, str], Component] = field(default_factory=dict)
    aliases: dict[tuple[str, str], str] = field(default_factory=dict)

    def add(self, component: Component) -> None:
        """Register one stamped record; a second ``kind/name`` is an error naming both origins."""
        _check_component(component)
        key = (component.kind, component.name)
        taken = self.components.get(key)
        if taken is None and key in self.aliases:
            taken = self.components[(component.kind, self.aliases[key])]
        if taken is not None:
            raise RegistryError(
                f"{component.kind} {component.name!r} from plugin {component.plugin!r} clashes "
                f"with the one from plugin {taken.plugin!r}"
            )
        self.components[key] = component
        for alias in component.aliases:
            self.aliases.setdefault((component.kind, alias), component.name)

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
        raise RegistryError(unknown_name(kind, name, self.names(kind)))

    def create(self, kind: str, name_or_spec: str | dict, /, *core_args: Any, **kwargs: Any):
        """Build a component from a name or a ``{kind: name, **params}`` spec.

        Core arguments go positionally or by keyword (``query_dim=64, key_dim=64, heads=8``); recipe
        parameters come from the spec. The spec is validated against the constructor first.
        """
        from .schema import SchemaError, Validator, call_with

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
        return call_with(component.cls, {**params, **kwargs}, *ordered)

    def resolve(self, kind: str, name: str, path) -> tuple[type, str]:
        """For the schema validator: (class, canonical name) or a SchemaError at ``path``."""
        from .schema import SchemaError

        try:
            component = self.get(kind, name)
        except RegistryError as error:
            raise SchemaError(path, str(error)) from None
        return component.cls, component.name


def _check_component(component: Component) -> None:
    """Reject records that would break the core's contract, naming the plugin."""
    where = f"plugin {component.plugin!r}: {component.kind} {component.name!r}"
    if not isinstance(component.cls, type):
        raise RegistryError(f"{where}: expected a class, got {component.cls!r}")
    base = BASES.get(component.kind)
    if base is not None and not issubclass(component.cls, base):
        raise RegistryError(f"{where}: {component.cls.__name__} must subclass {base.__name__}")
    core = CORE_ARGS.get(component.kind, ())
    if core:
        params = [p for p in inspect.signature(component.cls.__init__).parameters if p != "self"]
        if tuple(params[: len(core)]) != core:
            raise RegistryError(
                f"{where}: constructor must start with the core arguments {', '.join(core)}; "
                f"it starts with {', '.join(params[: len(core)]) or 'nothing'}"
            )


def _builtin_modules() -> list[str]:
    """Every ``seqzoo.plugins.<kind>.<name>`` module: one variant per file."""
    import seqzoo.plugins as root

    modules = []
    for kind in pkgutil.iter_modules(root.__path__):
        if not kind.ispkg:
            continue
        package = importlib.import_module(f"{root.__name__}.{kind.name}")
        for variant in pkgutil.iter_modules(package.__path__):
            if not variant.name.startswith("_"):
                modules.append(f"{package.__name__}.{variant.name}")
    return sorted(modules)


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("seqzoo")
    except Exception:  # running from a source tree that is not installed
        return "0+unknown"


def _collect(manager: pluggy.PluginManager, registry: Registry, plugin: object, name: str,
             distribution: str, version: str) -> None:
    """Call ``plugin``'s hook alone and add its stamped records."""
    for hookimpl in manager.hook.seqzoo_components.get_hookimpls():
        if hookimpl.plugin is not plugin:
            continue
        for record in hookimpl.function() or []:
            if not isinstance(record, Component):
                raise RegistryError(f"plugin {name!r}: seqzoo_components must return Component records, got {record!r}")
            registry.add(Component(record.kind, record.name, record.cls, tuple(record.aliases),
                                   record.summary, name, distribution, version))


def _build() -> Registry:
    manager = pluggy.PluginManager("seqzoo")
    manager.add_hookspecs(hookspecs)
    registry = Registry(manager)
    version = _version()
    for module_name in _builtin_modules():
        module = importlib.import_module(module_name)
        manager.register(module, name=module_name)
        _collect(manager, registry, module, module_name, "seqzoo", version)
        kind, variant = module_name.split(".")[-2:]
        if (kind, variant) not in registry.components:
            raise RegistryError(f"built-in plugin {module_name} must register {kind} {variant!r} (the file's name)")
    return registry


_lock = threading.Lock()
_registry: Registry | None = None


def registry() -> Registry:
    """The process-wide registry, built on first use."""
    global _registry
    if _registry is None:
        with _lock:
            if _registry is None:
                _registry = _build()
    return _registry


def _reset_for_tests() -> None:
    global _registry
    _registry = None

