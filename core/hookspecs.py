"""The one hook every seqzoo plugin implements.

A plugin is any object or module with a function named ``seqzoo_components`` decorated with
``seqzoo.hookimpl``. Built-in plugins (``seqzoo.plugins.<kind>.<name>``) and third-party ones
(entry-point group ``seqzoo``) go through exactly this hook.
"""
from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("seqzoo")
hookimpl = pluggy.HookimplMarker("seqzoo")


@hookspec
def seqzoo_components() -> list:
    """Return the components this plugin provides, as a list of ``seqzoo.Component`` records.

    Called once per process when the registry is first used. Each record names its ``kind``
    (``score``, ``position``, ``norm``, ``ffn``, ``cell``, ``model``, ``tokenizer``, ... or a new
    kind of the plugin's own), its registry ``name``, the class, optional ``aliases`` and a one-line
    ``summary``. The registry stamps every record with the plugin it came from.
    """
