"""Exceptions users can hit. Each carries a one-line message that names the thing and the fix."""
from __future__ import annotations

import difflib
from collections.abc import Iterable


class SeqzooError(Exception):
    """Base class for errors caused by user input; the CLI prints them as one line and exits 2."""


class RegistryError(SeqzooError, LookupError):
    """An unknown component name, or a plugin that broke the registry's rules."""


class RecipeError(SeqzooError, ValueError):
    """A recipe that cannot be built; the message starts with ``file:line: key.path:``."""


class CheckpointError(SeqzooError, ValueError):
    """A checkpoint file that cannot be read or does not match its recipe."""


def closest(name: str, choices: Iterable[str]) -> str | None:
    """The most similar of ``choices`` to ``name``, or None when nothing is close."""
    matches = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return matches[0] if matches else None


def few(items: list[str], n: int = 5) -> str:
    """The first ``n`` of ``items``, comma-separated, then ``and K more`` (for one-line messages)."""
    more = f" and {len(items) - n} more" if len(items) > n else ""
    return ", ".join(items[:n]) + more


def first_line(error: BaseException, *, with_type: bool = False) -> str:
    """The first line of an exception's message, for a one-line report: the type's name when the
    message is empty; ``with_type``: ``TypeName: line`` (for errors from code that is not seqzoo's)."""
    text = str(error).strip()
    line = text.splitlines()[0] if text else ""
    if not line:
        return type(error).__name__
    return f"{type(error).__name__}: {line}" if with_type else line


def unknown_name(what: str, name: str, choices: Iterable[str], *, plugin_hint: bool = False) -> str:
    """``unknown score 'scaled_dt'; did you mean 'scaled_dot'?`` or the list of what exists.

    ``plugin_hint``: when nothing is close, add that the name may come from a plugin that is not
    installed (component names; kinds and other names have no plugins to miss)."""
    choices = sorted(choices)
    match = closest(name, choices)
    if match is not None:
        return f"unknown {what} {name!r}; did you mean {match!r}?"
    available = ", ".join(choices) if choices else "none registered"
    message = f"unknown {what} {name!r}; available: {available}"
    if plugin_hint:
        message += "; it may come from a plugin that is not installed (`seqzoo plugins` lists the loaded ones)"
    return message


class ConfigError(SeqzooError, ValueError):
    """A component parameter that is valid on its own but not with the core's arguments (e.g. a
    rotary dim larger than the head dim). Raised by constructors; ``build`` and ``train`` report it
    as a ``RecipeError`` where the refusing component's spec was written (``Resolved.path_of``).

    ``spec``: the (kind, validated spec) of the innermost component that refused, which
    ``Registry.create`` records on the way out; None when no component was being created."""

    spec: tuple[str, dict] | None = None


class InputError(SeqzooError, ValueError):
    """Inputs a model cannot take (a sequence longer than its position table, a full cache)."""


class OutputIsFolder(SeqzooError, IsADirectoryError):
    """An output file's path names an existing folder. Also an ``IsADirectoryError``, as the write
    would have raised: code that tolerates a failed write (``except OSError``) still catches it."""


class TrainingError(SeqzooError):
    """Training cannot go on: a non-finite loss, or a model, tokenizer or data the task cannot use."""


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped training at a step boundary; ``message`` says where the checkpoint is."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class PluginWarning(UserWarning):
    """A plugin was skipped or one of its components rejected (the rest keeps working); filter it
    with ``warnings.filterwarnings("ignore", category=seqzoo.errors.PluginWarning)``."""


class PerformanceWarning(UserWarning):
    """A fast path is unavailable and a slower one computes the same result (numba missing for the
    fused scan, FlexAttention unable to compile); said once per process."""
