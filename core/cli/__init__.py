"""The ``seqzoo`` command line: ``main`` (in ``commands``) and the command groups it loads (train, plots, catalog,
Hugging Face import/export)."""
from __future__ import annotations

from .commands import main

__all__ = ["main"]
