"""Recipes: YAML files that say which components make a model.

Loading is ``yaml.safe_load`` only. ``extends:`` deep-merges a base recipe (a path relative to the
recipe, or a shipped recipe's name); ``--set key.path=value`` overrides parse their value as YAML.
Validation runs before any tensor exists and every problem is one ``RecipeError`` whose message
starts with ``file:line: key.path:``. The resolved recipe (defaults filled in) is plain data.
"""
from __future__ import annotations

import copy
import importlib.resources
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml

from ..config import RuntimeConfig, TrainConfig
from ..errors import RecipeError, RegistryError, closest
from ..interfaces import CORE_ARGS
from ..registry import registry
from ..schema import SchemaError, Spec, Validator, dotted
from .requires import Requirement, parse_requirement, parse_requires, requires_hint
from .yaml_lines import Location, read_yaml

FORMAT_VERSION = 1
MAX_EXTENDS_DEPTH = 16
MAX_RECIPE_BYTES = 1 << 20  # a recipe is a page of YAML, not a data file


# The runtime: and train: sections' schemas live in seqzoo.config (the trainer reads them too).
# Spec["kind"] names a component kind, not a forward reference: hence the noqa for F821.
def _top_level(
    model: Spec["model"],  # noqa: F821
    seqzoo: Literal[1] = FORMAT_VERSION,
    requires: list[str] = (),
    tokenizer: Spec["tokenizer"] = "bytes",  # noqa: F821
    runtime: RuntimeConfig = RuntimeConfig(),
    train: TrainConfig | None = None,
) -> None:
    """The schema of a whole recipe (``extends`` is consumed before validation).

    requires: distributions whose plugins provide the recipe's components, as pip requirements
    (``seqzoo-acme>=1.2``). Nothing is imported or installed because of them: when a component
    is missing, the error says which of them is not installed, too old, or not loaded.
    """


@dataclass
class Resolved:
    """A validated recipe: ``data`` with every default filled in, plus which components it names."""

    data: dict
    components: list[tuple[tuple, str, str]]
    source: _Source | None = None

    def error(self, path: tuple, message: str) -> RecipeError:
        """A RecipeError located where ``path`` was written (for problems found while building)."""
        return (self.source or _Source()).error(path, message)

    def path_of(self, spec: tuple[str, dict] | None, within: tuple) -> tuple:
        """Where a component's spec (a ``ConfigError``'s ``spec``) was written under ``within``: the
        first key path, depth first, of a mapping with the spec's kind and its values at every key;
        ``within`` itself when there is none (a spec the model derived rather than read)."""
        wanted = spec[1] if spec is not None else {}

        def paths(value, path: tuple):
            if isinstance(value, dict):
                if "kind" in value and all(key in wanted and wanted[key] == item for key, item in value.items()):
                    yield path
                for key, item in value.items():
                    yield from paths(item, (*path, key))
            elif isinstance(value, list):
                for index, item in enumerate(value):
                    yield from paths(item, (*path, index))

        section = self.data
        for key in within:
            section = section[key]
        return next(paths(section, within), within)


class _Source:
    """A recipe being assembled: merged data and where each key path was written. ``label`` names
    a recipe that came as data rather than a file (the checkpoint it was stored in)."""

    def __init__(self, label: str | None = None) -> None:
        self.data: dict = {}
        self.where: dict[tuple, Location] = {}
        self.label = label

    def locate(self, path: tuple) -> Location:
        for end in range(len(path), -1, -1):
            if path[:end] in self.where:
                return self.where[path[:end]]
        return ("<recipe>", 1)

    def error(self, path: tuple, message: str) -> RecipeError:
        file, line = self.locate(tuple(path))
        if file == "<recipe>" and self.label is not None:  # no lines to point at: name the key
            return RecipeError(f"{self.label}: recipe key {dotted(path)}: {message}" if path
                               else f"{self.label}: {message}")
        prefix = f"{file}:{line}: "
        return RecipeError(f"{prefix}{dotted(path)}: {message}" if path else f"{prefix}{message}")


# -- locating recipes ------------------------------------------------------------------------------
def shipped_recipes() -> list[str]:
    """Names of the recipes that ship with seqzoo."""
    root = importlib.resources.files("seqzoo.recipes")
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".yaml"))


def _find(ref: str, relative_to: Path | None) -> Path | None:
    """A recipe path: as given, relative to the including recipe, or a shipped recipe's name."""
    candidates = []
    path = Path(ref)
    if relative_to is not None and not path.is_absolute():
        candidates.append(relative_to / path)
    candidates.append(path)
    name = ref[:-5] if ref.endswith(".yaml") else ref
    if "/" not in name and os.sep not in name:
        shipped = importlib.resources.files("seqzoo.recipes") / f"{name}.yaml"
        candidates.append(Path(str(shipped)))
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    return None


def _load_file(path: Path, source: _Source, chain: tuple[Path, ...], file_label: str) -> dict:
    try:
        with path.open("rb") as handle:
            if _is_safetensors(handle.read(16)):
                raise RecipeError(f"{file_label}: is a checkpoint (safetensors), not a YAML recipe; its recipe "
                                  f"is inside it: `seqzoo train --init {file_label}` trains from its weights, "
                                  f"`--resume` continues its run, `seqzoo generate {file_label}` runs it")
        if path.stat().st_size > MAX_RECIPE_BYTES:
            raise RecipeError(f"{file_label}:1: recipe is {path.stat().st_size:,} bytes, over the "
                              f"{MAX_RECIPE_BYTES:,}-byte limit for recipes")
        raw = path.read_bytes()
    except OSError as error:
        raise RecipeError(f"{file_label}:1: cannot read recipe: {error.strerror or error}") from None
    if not raw.strip():
        raise RecipeError(f"{file_label}:1: the recipe file is empty; a recipe needs at least a model: "
                          f"section (or extends: a shipped recipe such as tiny-gpt)")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        raise RecipeError(f"{file_label}:{line}: recipe is not valid UTF-8 (byte {error.start})") from None
    data, where = read_yaml(text, file_label)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise RecipeError(f"{file_label}:1: a recipe must be a mapping of keys, got {type(data).__name__}")
    base_ref = data.pop("extends", None)
    if base_ref is None:
        merged, merged_where = {}, {}
    else:
        line = where.get(("extends",), (file_label, 1))[1]
        if not isinstance(base_ref, str):
            raise RecipeError(f"{file_label}:{line}: extends: expected a recipe path or name, got {base_ref!r}")
        base = _find(base_ref, path.parent)
        if base is None:
            raise RecipeError(
                f"{file_label}:{line}: extends: no recipe {base_ref!r} (looked next to {path.name} and "
                f"among the shipped recipes: {', '.join(shipped_recipes())})"
            )
        resolved = base.resolve()
        if resolved in chain:
            cycle = " -> ".join(p.name for p in (*chain, resolved))
            raise RecipeError(f"{file_label}:{line}: extends: cycle {cycle}")
        if len(chain) >= MAX_EXTENDS_DEPTH:
            raise RecipeError(f"{file_label}:{line}: extends: chain deeper than {MAX_EXTENDS_DEPTH} recipes")
        inner = _Source()
        merged = _load_file(base, inner, (*chain, resolved), _label(base))
        merged_where = inner.where
    source.where.update(merged_where)
    _merge(merged, data, (), source.where)
    where.pop(("extends",), None)
    source.where.update(where)
    return merged


def _is_safetensors(head: bytes) -> bool:
    """Whether a file starting with ``head`` is a safetensors file: an 8-byte little-endian header
    size, then the JSON header (YAML text never starts with 8 bytes and a brace)."""
    return len(head) >= 10 and head[8:10] in (b'{"', b"{}") and int.from_bytes(head[:8], "little") >= 2


def _label(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _merge(base: dict, child: dict, path: tuple, where: dict) -> None:
    """Deep-merge ``child`` into ``base`` in place. A component mapping whose ``kind`` changes
    replaces the base's mapping (parameters of another kind must not leak in)."""
    for key, value in child.items():
        old = base.get(key)
        mergeable = isinstance(old, dict) and isinstance(value, dict)
        if mergeable and "kind" in value and old.get("kind", value["kind"]) != value["kind"]:
            mergeable = False
        if mergeable:
            _merge(old, value, (*path, key), where)
        else:
            prefix = (*path, key)
            for stale in [p for p in where if p[: len(prefix)] == prefix and len(p) > len(prefix)]:
                del where[stale]
            base[key] = copy.deepcopy(value)


def _key_paths(data: dict, prefix: tuple = ()):
    """Every key path of nested mappings, parents first."""
    for key, value in data.items():
        yield (*prefix, key)
        if isinstance(value, dict):
            yield from _key_paths(value, (*prefix, key))


class Override(str):
    """A ``KEY.PATH=VALUE`` override written in a file (a contender file's ``set:``): a string like
    any override, that also knows its file and line, so its errors point there, not at ``--set[i]``."""

    location: Location

    def __new__(cls, text: str, location: Location) -> Override:
        override = super().__new__(cls, text)
        override.location = location
        return override

    def __getnewargs__(self) -> tuple[str, Location]:  # copies and pickles keep the location
        return str(self), self.location


def _apply_override(source: _Source, override: str, index: int) -> None:
    label, line = override.location if isinstance(override, Override) else (f"--set[{index}]", 1)
    key, sep, text = override.partition("=")
    key = key.strip()
    if not sep or not key:
        raise RecipeError(f"{label}:{line}: {override!r}: an override is key.path=value, e.g. model.layers=4")
    path = tuple(key.split("."))
    if any(not part for part in path):
        raise RecipeError(f"{label}:{line}: {key}: empty key in the path")
    try:
        value = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError as error:
        raise RecipeError(f"{label}:{line}: {key}: value {text!r} is not valid YAML "
                          f"({str(error).splitlines()[0]})") from None
    node = source.data
    for depth, part in enumerate(path[:-1]):
        if not isinstance(node.get(part), dict):
            if part in node and node[part] is not None and not isinstance(node[part], str):
                raise RecipeError(f"{label}:{line}: {dotted(path[: depth + 1])}: is not a mapping, cannot set {key}")
            if part not in node:  # a key the override brings: its mistakes are the override's
                source.where[path[: depth + 1]] = (label, line)
            # A component named by a string becomes a mapping so a parameter can be set on it.
            node[part] = {"kind": node[part]} if isinstance(node.get(part), str) else {}
        node = node[part]
    _merge(node, {path[-1]: value}, path[:-1], source.where)
    for stale in [p for p in source.where if p[: len(path)] == path]:
        del source.where[stale]
    source.where[path] = (label, line)


# -- the entry point -------------------------------------------------------------------------------
def resolve(recipe: str | os.PathLike | dict, overrides: list[str] | None = None, *,
            label: str | None = None) -> Resolved:
    """Load, merge, override and validate a recipe; raise one ``RecipeError`` on any problem.

    ``label`` names where a dict recipe came from (a checkpoint's path), so errors say
    ``LABEL: recipe key model.x: ...`` instead of pointing at a line it does not have."""
    source = _Source(label)
    if isinstance(recipe, dict):
        source.data = copy.deepcopy(recipe)
        if "extends" in source.data:
            base_ref = source.data.pop("extends")
            base = _find(str(base_ref), None) if isinstance(base_ref, str) else None
            if base is None:
                raise source.error(("extends",), f"no recipe {base_ref!r}")
            inner = _Source()
            merged = _load_file(base, inner, (base.resolve(),), _label(base))
            source.where.update(inner.where)
            _merge(merged, source.data, (), source.where)
            # Keys the dict itself sets are reported as the dict's, not the base file's lines.
            source.where.update({path: ("<recipe>", 1) for path in _key_paths(source.data)})
            source.data = merged
    else:
        path = _find(os.fspath(recipe), None)
        if path is None:
            match = closest(os.fspath(recipe), shipped_recipes())
            hint = f"did you mean {match!r}?" if match else f"shipped: {', '.join(shipped_recipes())}"
            raise RecipeError(f"{os.fspath(recipe)}:1: no such recipe file or shipped recipe; {hint}")
        source.data = _load_file(path, source, (path.resolve(),), _label(path))
    for index, override in enumerate(overrides or [], start=1):
        _apply_override(source, override, index)
    return validate(source)


def validate(source: _Source) -> Resolved:
    registry_ = registry()
    try:
        requirements = parse_requires(source.data.get("requires") if isinstance(source.data, dict) else None)
    except SchemaError as error:
        raise source.error(error.path, error.message) from None

    def resolve_component(kind: str, name: str, path: tuple) -> tuple[type, str]:
        try:
            return registry_.resolve(kind, name, path)
        except SchemaError as error:
            if requirements:  # say which distribution the recipe expected to provide it
                hint, not_installed = requires_hint(requirements, registry_)
                # A missing distribution is the cause: say it first, without a did-you-mean that
                # points at an unrelated built-in.
                error.message = (f"{kind} {name!r} is not available: {hint}" if not_installed
                                 else f"{error.message}; {hint}")
            raise

    version = source.data.get("seqzoo", FORMAT_VERSION) if isinstance(source.data, dict) else FORMAT_VERSION
    if version != FORMAT_VERSION or isinstance(version, bool):
        raise source.error(("seqzoo",), f"recipe format version {version!r} is not supported; this seqzoo "
                                        f"reads version {FORMAT_VERSION} only (write seqzoo: "
                                        f"{FORMAT_VERSION}, or upgrade seqzoo for newer recipes)")
    validator = Validator(resolve_component, lambda kind: CORE_ARGS.get(kind, ()))
    validator.collected = []
    try:
        data = validator.params(_top_level, source.data, ())
        if validator.collected:
            raise _all_of(source, validator.collected)
        # Cross-field rules (a Model declares check_recipe); the validator records what they resolve.
        registry_.get("model", data["model"]["kind"]).cls.check_recipe(data["model"], ("model",), validator)
        tokenizer_cls = registry_.get("tokenizer", data["tokenizer"]["kind"]).cls
        _check_vocab(tokenizer_cls, data)
    except SchemaError as error:
        raise source.error(error.path, error.message) from None
    except RegistryError as error:  # a component that exists but fails while being inspected
        raise source.error((), str(error)) from None
    return Resolved(data, validator.components, source)


#: The most recipe errors reported at once (a compiler's limit: the rest usually follow from them).
MAX_ERRORS = 10


def _all_of(source: _Source, errors: list[SchemaError]) -> RecipeError:
    """One RecipeError listing every error (a line each, up to MAX_ERRORS), in the order found."""
    lines = [str(source.error(e.path, e.message)) for e in errors[:MAX_ERRORS]]
    if len(errors) > MAX_ERRORS:
        lines.append(f"... and {len(errors) - MAX_ERRORS} more error(s)")
    return RecipeError("\n".join(lines))


def _check_vocab(tokenizer_cls: type, data: dict) -> None:
    """The model's vocabulary must hold every id the tokenizer can produce."""
    needed = tokenizer_cls.vocab_size  # an int when fixed; a property (or None) when read from a file
    vocab = data["model"].get("vocab_size")
    if isinstance(needed, int) and isinstance(vocab, int) and vocab < needed:
        raise SchemaError(
            ("model", "vocab_size"),
            f"{vocab} is smaller than the {data['tokenizer']['kind']} tokenizer's {needed} ids; "
            f"set model.vocab_size >= {needed}",
        )


__all__ = ["FORMAT_VERSION", "MAX_ERRORS", "Override", "Requirement", "Resolved", "parse_requirement", "resolve",
           "shipped_recipes", "validate"]
