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

import os
import threading

from ..errors import RegistryError
from ..interfaces import Model
from .components import Component, Plugin, Registry
from .loading import BUILTINS, ENTRY_POINT_GROUP, _load_local, build_registry, builtin, own_doc
from .settings import canonical_name, installed_version, strict

_lock = threading.RLock()
_registry: Registry | None = None


def registry() -> Registry:
    """The process-wide registry, built on first use."""
    global _registry
    if _registry is None:
        with _lock:
            if _registry is None:
                _registry = build_registry()
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


__all__ = ["BUILTINS", "ENTRY_POINT_GROUP", "Component", "Plugin", "Registry", "build_registry", "builtin",
           "canonical_name",
           "installed_version", "load_plugin", "own_doc", "registry", "strict", "tokenizer"]
