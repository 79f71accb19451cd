"""Plugin settings read from the environment (``SEQZOO_STRICT_PLUGINS``, ``SEQZOO_DISABLE_PLUGINS``)
and the names and versions of distributions, compared as pip compares them."""
from __future__ import annotations

import os
import re
from importlib.metadata import PackageNotFoundError, version

_TRUE = ("1", "true", "yes", "on")


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
