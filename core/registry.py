"""The component registry: one pluggy PluginManager, one hook, every variant a record.

Plugins are registered in this order, all through the same ``seqzoo_components`` hook:

1. built-in plugins, every module under ``seqzoo.plugins.<kind>`` (a failure here is a seqzoo bug
   and raises);
2. third-party plugins, the entry points of group ``seqzoo`` of installed distributions, unless
   ``SEQZOO_DISABLE_PLUGINS`` is ``1`` (all of them) or names them (a comma-separated list of
   entry-point or distribution names);
3. local plugins the user names: ``SEQZOO_PLUGINS`` (``os.pathsep``-separated ``.py`` files or
   module names), then ``seqzoo --plugin`` / ``seqzoo.load_plugin`` calls.

A recipe or a checkpoint never causes an import. A third-party or local plugin that fails to
import or register is reported on stderr as one line naming the plugin and the cause, and skipped;
a component that breaks its interface or takes a ``kind/name`` already registered is rejected the
same way and the first one registered (built-ins first) is kept. ``SEQZOO_STRICT_PLUGINS=1`` turns
every such report into a ``RegistryError``.

The registry is built once per process, on first use, so ``import seqzoo`` stays cheap.
"""
from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import inspect
import os
import pkgutil
import re
import sys
import threading
import typing
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, entry_points, packages_distributions, version
from pathlib import Path
from typing import Any

import pluggy

from . import hookspecs
from .errors import RegistryError, closest, first_line, unknown_name
from .interfaces import BASES, CORE_ARGS, Model
from .schema import Configured, SchemaError, Validator, call_with, instantiate, spec_kind

ENTRY_POINT_GROUP = "seqzoo"
_TRUE = ("1", "true", "yes", "on")


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
        """A plugin problem: one line on stderr, or a RegistryError under SEQZOO_STRICT_PLUGINS=1."""
        self.problems.append(message)
        if strict():
            raise RegistryError(message)
        print(f"seqzoo: warning: {message}", file=sys.stderr)

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
        if issubclass(component.cls, Configured):  # one dataclass of parameters, then its parts' factories
            config = instantiate(params, component.cls.Config)
            return component.cls(*ordered, config, **self.factories(component.cls.Config, params, only_specs=True),
                                 **kwargs)
        return call_with(component.cls, {**self.factories(component.cls.__init__, params), **kwargs}, *ordered)

    def factories(self, schema: Any, params: dict, *, only_specs: bool = False) -> dict:
        """``params`` with every ``Spec[kind]`` parameter's spec (per ``schema``'s hints: a
        constructor or a dataclass) turned into a factory of that component (``create`` bound to
        this registry), so a constructor builds its parts without asking for the registry, and a
        test can hand it any ``nn.Module`` factory instead. ``only_specs``: just the factories."""
        hints = typing.get_type_hints(schema, include_extras=True)
        out = {} if only_specs else dict(params)
        for name, value in params.items():
            kind = spec_kind(hints.get(name))
            if kind is not None and value is not None:
                out[name] = functools.partial(self.create, kind, value)
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


# -- settings read from the environment --------------------------------------------------------
def strict() -> bool:
    """SEQZOO_STRICT_PLUGINS=1: plugin problems raise instead of being reported and skipped."""
    return os.environ.get("SEQZOO_STRICT_PLUGINS", "").strip().lower() in _TRUE


def canonical_name(name: str) -> str:
    """A distribution or plugin name compared the way pip does (case, ``-``/``_``/``.`` alike)."""
    return re.sub(r"[-_.]+", "-", name.strip()).lower()


def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution``, or None when it is not installed."""
    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def _disabled() -> tuple[bool, set[str]]:
    """(all third-party plugins off?, names turned off) from SEQZOO_DISABLE_PLUGINS."""
    raw = os.environ.get("SEQZOO_DISABLE_PLUGINS", "").strip()
    if not raw or raw.lower() in ("0", "false", "no", "off"):
        return False, set()
    if raw.lower() in (*_TRUE, "all", "*"):
        return True, set()
    return False, {canonical_name(n) for n in raw.split(",") if n.strip()}


def _is_disabled(*names: str) -> bool:
    everything, listed = _disabled()
    return everything or any(n and canonical_name(n) in listed for n in names)


# -- registering one plugin ------------------------------------------------------------------------
def _describe(value: object) -> str:
    text = repr(value)
    return (text[:60] + "...") if len(text) > 63 else text


def _register(reg: Registry, obj: object, info: Plugin) -> Plugin:
    """Register ``obj`` under ``info.name``, call its hook and add its records.

    Hook-level problems (no hook, an unknown hook, a hook that raises or returns something other
    than Component records) skip the whole plugin; component-level problems (interface, clash)
    reject that component only. Returns ``info`` with its status filled in and records it.
    """
    reg.plugins[info.name] = info
    manager = reg.manager
    try:
        manager.register(obj, name=info.name)
    except (pluggy.PluginValidationError, ValueError) as error:
        return _skip(info, first_line(error, with_type=True))
    callers = manager.get_hookcallers(obj) or []
    unknown = [c.name for c in callers if c.spec is None]
    if unknown:
        manager.unregister(obj)
        match = closest(unknown[0], ["seqzoo_components"])
        fix = f"; did you mean {match!r}?" if match else " (seqzoo's hook is seqzoo_components)"
        return _skip(info, f"unknown hook {unknown[0]!r}{fix}")
    impls = [i for i in manager.hook.seqzoo_components.get_hookimpls() if i.plugin is obj]
    if not impls:
        manager.unregister(obj)
        undecorated = callable(getattr(obj, "seqzoo_components", None))
        return _skip(info, "seqzoo_components is not decorated with @seqzoo.hookimpl" if undecorated
                     else "it has no seqzoo_components hook (a function of that name decorated with "
                          "@seqzoo.hookimpl)")
    try:
        records = impls[0].function()
    except Exception as error:  # a plugin's bug must not take the registry down
        manager.unregister(obj)
        return _skip(info, f"seqzoo_components() raised {first_line(error, with_type=True)}")
    if not isinstance(records, (list, tuple)):
        manager.unregister(obj)
        return _skip(info, f"seqzoo_components() returned {_describe(records)}; expected a list of "
                           f"seqzoo.Component records")
    for record in records:
        if not isinstance(record, Component):
            manager.unregister(obj)
            return _skip(info, f"seqzoo_components() returned {_describe(record)} among its records; "
                               f"expected seqzoo.Component")
    info.hooks = tuple(sorted(c.name for c in callers))
    info.status = "loaded"
    for record in records:
        aliases = (record.aliases,) if isinstance(record.aliases, str) else tuple(record.aliases or ())
        summary = record.summary or _doc_line(record.cls)
        stamped = Component(record.kind, record.name, record.cls, aliases, summary, info.name,
                            info.distribution, info.version)
        if reg.add(stamped):
            info.components.append(stamped)
    return info


def _skip(info: Plugin, reason: str) -> Plugin:
    info.status, info.reason = "skipped", reason
    return info


def _doc_line(cls: object) -> str:
    """The first line of the class's own docstring, or "" without one. Not ``inspect.getdoc``: it
    follows inheritance, and a bare subclass would be summarised by its interface's text."""
    doc = own_doc(cls)
    return doc.splitlines()[0] if doc else ""


def own_doc(cls: object) -> str:
    """The class's own docstring, cleaned, or "" (an inherited one does not count)."""
    doc = cls.__dict__.get("__doc__") if isinstance(cls, type) else None
    return inspect.cleandoc(doc) if isinstance(doc, str) else ""


# -- built-in plugins ------------------------------------------------------------------------------
def _builtin_modules() -> list[str]:
    """Every ``seqzoo.plugins.<kind>.<name>`` module: one variant per file."""
    root = importlib.import_module("seqzoo.plugins")  # by name: the core never imports its plugins
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
        return version("seqzoo")
    except Exception:  # running from a source tree that is not installed
        return "0+unknown"


#: The module attribute ``builtin`` fills: the module's marked classes, (cls, name, aliases, summary).
BUILTINS = "__seqzoo_builtins__"


def builtin(summary: str = "", *, aliases: tuple[str, ...] = (), name: str | None = None):
    """Mark a class as its module's built-in component. Kind and name come from where the module is,
    ``seqzoo.plugins.KIND.NAME`` (``name`` for a second variant of the same file). The loader
    turns a module's marked classes into its ``seqzoo_components`` hook, so built-ins reach the
    registry through the same hook as every plugin; third-party plugins write the hook themselves
    (docs/plugins.md). ``summary``: the one-line description (default: the docstring's first line)."""
    def mark(cls: type) -> type:
        module = sys.modules[cls.__module__]
        module.__dict__.setdefault(BUILTINS, []).append((cls, name, tuple(aliases), summary))
        return cls
    return mark


class _BuiltinHook:
    """The ``seqzoo_components`` hook of one built-in module, made from its ``builtin`` marks."""

    def __init__(self, components: list[Component]) -> None:
        self.components = components

    @hookspecs.hookimpl
    def seqzoo_components(self) -> list[Component]:
        return list(self.components)


def _builtin_hook(module) -> _BuiltinHook:
    kind, variant = module.__name__.split(".")[-2:]
    return _BuiltinHook([Component(kind, name or variant, cls, aliases, summary)
                         for cls, name, aliases, summary in vars(module).get(BUILTINS, [])])


def _load_builtins(reg: Registry) -> None:
    seqzoo_version = _version()
    for module_name in _builtin_modules():
        module = importlib.import_module(module_name)
        before = len(reg.problems)
        info = _register(reg, _builtin_hook(module), Plugin(module_name, "built-in", "seqzoo", seqzoo_version))
        if info.status != "loaded":
            raise RegistryError(info.message)
        if len(reg.problems) > before:  # a built-in that breaks the rules is seqzoo's own bug
            raise RegistryError(reg.problems[before])
        kind, variant = module_name.split(".")[-2:]
        if (kind, variant) not in reg.components:
            raise RegistryError(f"built-in plugin {module_name} must register {kind} {variant!r} (the file's name)")


# -- third-party plugins: entry points --------------------------------------------------------------
def _load_entry_points(reg: Registry) -> None:
    """Every entry point of group ``seqzoo``, in name order (so a clash resolves the same way)."""
    seen = set()
    for point in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda p: (p.name, p.value)):
        if (point.name, point.value) in seen:  # the same distribution found twice on sys.path
            continue
        seen.add((point.name, point.value))
        dist = getattr(point, "dist", None)
        info = Plugin(point.name, "entry point", dist.name if dist else "", dist.version if dist else "")
        if point.name in reg.plugins:
            other = reg.plugins[point.name]
            reg.report(f"{info.label} skipped: its name is taken by {other.label}; rename the entry point")
            continue
        if _is_disabled(point.name, info.distribution):
            info.status, info.reason = "disabled", "SEQZOO_DISABLE_PLUGINS"
            reg.plugins[info.name] = info
            continue
        try:
            obj = point.load()
        except Exception as error:
            reg.plugins[info.name] = _skip(info, f"cannot import {point.value}: {first_line(error, with_type=True)}")
            reg.report(info.message)
            continue
        if _register(reg, obj, info).status == "skipped":
            reg.report(info.message)


# -- local plugins: named by the user -------------------------------------------------------------
_MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def _is_path(ref: str) -> bool:
    return ref.endswith(".py") or "/" in ref or os.sep in ref or not _MODULE_NAME.fullmatch(ref)


def _load_local(reg: Registry, ref: str) -> Plugin:
    """Import a ``.py`` file or a module the user named and register it; never raises for the
    plugin's own faults (the returned Plugin says what happened)."""
    if _is_path(ref):
        path = Path(ref).expanduser()
        name = str(path.resolve()) if path.exists() else ref
        info = reg.plugins.get(name)
        if info is not None and info.status == "loaded":
            return info
        info = Plugin(name, "local")
        if not path.is_file():
            reg.plugins[name] = info
            what = "a directory, not a .py file" if path.is_dir() else "no such file"
            return _skip(info, f"{ref}: {what}")
        digest = hashlib.sha1(name.encode()).hexdigest()[:8]
        stem = re.sub(r"\W", "_", path.stem)
        module_name = f"seqzoo_local_{stem}_{digest}"
        try:
            spec = importlib.util.spec_from_file_location(module_name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module  # dataclasses and pickling look modules up by name
            spec.loader.exec_module(module)
        except Exception as error:
            sys.modules.pop(module_name, None)
            reg.plugins[name] = info
            return _skip(info, f"cannot import {ref}: {first_line(error, with_type=True)}")
        return _register(reg, module, info)
    info = reg.plugins.get(ref)
    if info is not None and info.status == "loaded":
        return info
    try:
        module = importlib.import_module(ref)
    except Exception as error:
        info = reg.plugins[ref] = Plugin(ref, "local")
        nearby = Path(f"{ref}.py")
        hint = f" (to load the file, write ./{nearby})" if isinstance(error, ImportError) and nearby.is_file() else ""
        return _skip(info, f"cannot import {ref}: {first_line(error, with_type=True)}{hint}")
    if reg.manager.is_registered(module):  # already loaded, e.g. through its entry point
        return reg.plugins[reg.manager.get_name(module)]
    distribution, version = _distribution_of(module)
    return _register(reg, module, Plugin(ref, "local", distribution, version))


def _distribution_of(module: object) -> tuple[str, str]:
    """The installed distribution that ships ``module``'s top-level package, if any."""
    top = getattr(module, "__name__", "").split(".")[0]
    try:
        names = packages_distributions().get(top) or []
        return (names[0], version(names[0])) if names else ("", "")
    except Exception:  # broken metadata must not stop a plugin from loading
        return "", ""


def _load_env_plugins(reg: Registry) -> None:
    for ref in os.environ.get("SEQZOO_PLUGINS", "").split(os.pathsep):
        ref = ref.strip()
        if not ref:
            continue
        if _is_disabled(ref, Path(ref).stem):
            reg.plugins[ref] = Plugin(ref, "local", status="disabled", reason="SEQZOO_DISABLE_PLUGINS")
            continue
        info = _load_local(reg, ref)
        if info.status == "skipped":
            reg.report(info.message)


def load_plugin(ref: str | os.PathLike) -> Plugin:
    """Load a local plugin now: a ``.py`` file or an importable module name.

    This is the Python form of ``seqzoo --plugin``. The plugin's components join the process-wide
    registry (its problems with single components are reported like any plugin's). A plugin that
    cannot be imported or has a broken hook raises ``RegistryError`` naming it and the cause.
    Loading the same plugin twice is harmless.
    """
    reg = registry()
    with _lock:
        info = _load_local(reg, os.fspath(ref).strip())
    if info.status != "loaded":
        reg.problems.append(info.message)
        raise RegistryError(info.message)
    return info


def _build() -> Registry:
    manager = pluggy.PluginManager("seqzoo")
    manager.add_hookspecs(hookspecs)
    reg = Registry(manager)
    _load_builtins(reg)
    _load_entry_points(reg)
    _load_env_plugins(reg)
    return reg


_lock = threading.RLock()
_registry: Registry | None = None


def registry() -> Registry:
    """The process-wide registry, built on first use."""
    global _registry
    if _registry is None:
        with _lock:
            if _registry is None:
                _registry = _build()
    return _registry


def tokenizer(model_or_recipe, state: str | None = None):
    """The tokenizer named by a model's (or a resolved recipe's) ``tokenizer:`` section.

    A model that carries its tokenizer's serialised form (``Model.tokenizer_state``, set by
    ``seqzoo.load`` and ``seqzoo.from_hf``) rebuilds it from that (``Tokenizer.from_str``), so it
    needs no file outside the checkpoint; for a recipe, ``state`` gives that form.
    """
    if isinstance(model_or_recipe, Model):
        recipe, state = model_or_recipe.recipe, model_or_recipe.tokenizer_state
    else:
        recipe = model_or_recipe
    if state is not None:
        spec = recipe["tokenizer"]
        params = {"kind": spec} if isinstance(spec, str) else dict(spec)
        return registry().get("tokenizer", params.pop("kind")).cls.from_str(state, **params)
    return registry().create("tokenizer", recipe["tokenizer"])


def _reset_for_tests() -> None:
    global _registry
    _registry = None
