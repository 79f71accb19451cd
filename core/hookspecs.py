"""The one hook every seqzoo plugin implements.

A plugin is any module or object with a function named ``seqzoo_components`` decorated with
``seqzoo.hookimpl``. Built-in plugins (``seqzoo.plugins.<kind>.<name>``), installed third-party
plugins (entry-point group ``seqzoo``) and local plugins the user names (``seqzoo --plugin``,
``SEQZOO_PLUGINS``, ``seqzoo.load_plugin``) all go through exactly this hook. See docs/plugins.md.
"""
from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("seqzoo")
hookimpl = pluggy.HookimplMarker("seqzoo")


@hookspec
def seqzoo_components() -> list:
    """Return the components this plugin provides, as a list of ``seqzoo.Component`` records.

    Called once per process, for this plugin alone, when the registry is first used (or when the
    plugin is loaded by ``seqzoo.load_plugin``). Each record names its ``kind`` (``score``,
    ``position``, ``norm``, ``ffn``, ``cell``, ``model``, ``tokenizer``, ... or a new kind of the
    plugin's own), its registry ``name``, the class, optional ``aliases`` and a one-line
    ``summary`` (the first line of the class's own docstring when empty). The registry stamps every record
    with the plugin, distribution and version it came from.

    The hook must not import anything heavy or touch the network: it runs on every ``seqzoo list``.
    If it raises or returns anything but ``Component`` records, the whole plugin is skipped with a
    one-line report; a record whose class breaks its kind's interface, or whose ``kind/name`` is
    already taken, is rejected alone.
    """
