"""``requires:``: the distributions a recipe expects, parsed as pip requirements and checked
against what is installed, for the error that names what is missing."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..registry import canonical_name, installed_version
from ..schema import SchemaError


@dataclass(frozen=True)
class Requirement:
    """A parsed ``requires:`` entry: ``text`` as written, the distribution ``name`` and a test for
    whether an installed version satisfies it (``packaging`` when installed, else a small parser
    for ``NAME``, ``NAME[extras]`` and comma-separated ``==, !=, >=, <=, >, <, ~=`` clauses)."""

    text: str
    name: str
    satisfied_by: Any  # Callable[[str], bool]


_REQUIREMENT = re.compile(
    r"\s*(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*(?:\[[^\]]*\])?\s*"
    r"(?P<spec>(?:(?:===|==|!=|>=|<=|~=|>|<)\s*[A-Za-z0-9.*+!_-]+\s*,?\s*)*)$"
)


def parse_requirement(text: str) -> Requirement:
    """``seqzoo-acme>=1.2`` -> Requirement; ValueError for anything else."""
    try:
        from packaging.requirements import InvalidRequirement
        from packaging.requirements import Requirement as Packaging
    except ImportError:
        return _parse_requirement_fallback(text)
    try:
        req = Packaging(text)
    except InvalidRequirement as error:
        raise ValueError(str(error).splitlines()[0]) from None
    if req.url:
        raise ValueError("a URL requirement cannot be checked against installed versions")

    def satisfied_by(version: str) -> bool:
        try:
            return req.specifier.contains(version, prereleases=True)
        except Exception:  # an installed version packaging cannot parse satisfies nothing
            return False

    return Requirement(text, req.name, satisfied_by)


def _parse_requirement_fallback(text: str) -> Requirement:
    match = _REQUIREMENT.fullmatch(text)
    if match is None:
        raise ValueError("not NAME or NAME followed by version clauses such as >=1.2")
    clauses = [c.strip() for c in match["spec"].split(",") if c.strip()]
    parsed = []
    for clause in clauses:
        op = re.match(r"===|==|!=|>=|<=|~=|>|<", clause)[0]
        parsed.append((op, clause[len(op):].strip()))
    return Requirement(text, match["name"], lambda version: all(_compare(version, op, v) for op, v in parsed))


def _release(version: str) -> list[int]:
    """``1.2.3rc1`` -> [1, 2, 3]: the release numbers (a pre-release marker ends them)."""
    parts = []
    for piece in version.split("+")[0].split("."):
        digits = re.match(r"\d+", piece)
        if digits is None:
            break
        parts.append(int(digits[0]))
        if digits[0] != piece:
            break
    return parts


def _padded(parts: list[int], n: int) -> tuple[int, ...]:
    return tuple(parts[:n]) + (0,) * max(0, n - len(parts))


def _compare(version: str, op: str, wanted: str) -> bool:
    """``version op wanted`` on release numbers (1.2 == 1.2.0); ``===`` compares text."""
    if op == "===":
        return version == wanted
    have = _release(version)
    if op in ("==", "!=") and wanted.endswith(".*"):
        prefix = _release(wanted[:-2])
        same = _padded(have, len(prefix)) == tuple(prefix)
        return same if op == "==" else not same
    want = _release(wanted)
    n = max(len(have), len(want))
    a, b = _padded(have, n), _padded(want, n)
    if op == "~=":  # ~=1.4.2 means >=1.4.2 and ==1.4.*
        keep = max(1, len(want) - 1)
        return a >= b and _padded(have, keep) == tuple(want[:keep])
    return {"==": a == b, "!=": a != b, ">=": a >= b, "<=": a <= b, ">": a > b, "<": a < b}[op]


def parse_requires(value: Any) -> list[Requirement]:
    """The recipe's ``requires:`` list, parsed; a SchemaError at the bad entry otherwise."""
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        raise SchemaError(("requires",), f"expected a list of distribution requirements such as "
                                         f"[seqzoo-acme>=1.2], got {value!r}")
    out = []
    for index, text in enumerate(value):
        if not isinstance(text, str):
            raise SchemaError(("requires", index), f"expected a requirement string such as "
                                                   f"'seqzoo-acme>=1.2', got {text!r}")
        try:
            out.append(parse_requirement(text))
        except ValueError as error:
            raise SchemaError(("requires", index), f"{text!r} is not a distribution requirement "
                                                   f"({error}); write e.g. seqzoo-acme>=1.2") from None
    return out


def requires_hint(requirements: list[Requirement], registry_) -> tuple[str, bool]:
    """Why a component the recipe names may be missing, in terms of its ``requires:`` list, and
    whether a required distribution is missing or too old (then that is the likely cause)."""
    notes, satisfied = [], []
    for req in requirements:
        installed = installed_version(req.name)
        if installed is None:
            notes.append(f"{req.text}, which is not installed (pip install '{req.text}')")
        elif not req.satisfied_by(installed):
            notes.append(f"{req.text}, but {req.name} {installed} is installed (pip install -U '{req.text}')")
        else:
            satisfied.append((req, installed))
    if not notes:
        for req, installed in satisfied:
            plugins = [p for p in registry_.plugins.values()
                       if p.distribution and canonical_name(p.distribution) == canonical_name(req.name)]
            if any(p.status == "disabled" for p in plugins):
                state = "disabled by SEQZOO_DISABLE_PLUGINS"
            elif any(p.status == "skipped" for p in plugins):
                state = "installed but its plugin failed to load (see `seqzoo plugins`)"
            elif plugins:
                state = "loaded but does not provide it"
            else:
                state = "installed but registers no seqzoo plugin"
            notes.append(f"{req.text}, and {req.name} {installed} is {state}")
        return "the recipe requires " + "; and ".join(notes), False
    return "the recipe requires " + "; and ".join(notes), True
