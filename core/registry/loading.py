"""Loading plugins into a registry: the built-ins (``seqzoo.plugins.<kind>.<name>``, marked with
``builtin``), installed distributions' entry points, and the local plugins a user names — each
through the one ``seqzoo_components`` hook, each problem one line naming the plugin."""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import pkgutil
import re
import sys
from importlib.metadata import entry_points, packages_distributions, version
from pathlib import Path

import pluggy

from .. import hookspecs
from ..errors import RegistryError, closest, first_line
from .components import Component, Plugin, Registry
from .settings import _is_disabled

ENTRY_POINT_GROUP = "seqzoo"


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


def build_registry() -> Registry:
    """A registry with every plugin this environment provides: built-ins, entry points, SEQZOO_PLUGINS."""
    manager = pluggy.PluginManager("seqzoo")
    manager.add_hookspecs(hookspecs)
    reg = Registry(manager)
    _load_builtins(reg)
    _load_entry_points(reg)
    _load_env_plugins(reg)
    return reg
