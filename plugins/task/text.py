"""Task `text`: language modelling on a local text file, or a folder of them (UTF-8), with a
held-out split.

The file is split once: the first ``1 − validation`` of it trains, the rest validates. Each
example is a random window of ``window`` characters with an empty prompt; text is scored by loss,
not exact match.
"""
from __future__ import annotations

import random
import warnings
from pathlib import Path

from seqzoo.errors import ConfigError
from seqzoo.interfaces import Task
from seqzoo.registry import builtin
from seqzoo.schema import PositiveInt, Probability


@builtin("language modelling on a local text file, train/validation split")
class TextTask(Task):
    """path: a text file, or a folder whose ``*.txt`` files (sorted, recursively) are joined
    (required). window: characters per example (128). validation: the fraction held out at the
    end of the text (0.1)."""

    exact_match = False

    def __init__(self, path: str, window: PositiveInt = 128, validation: Probability = 0.1) -> None:
        file = Path(path).expanduser()
        files = sorted(file.rglob("*.txt")) if file.is_dir() else [file]
        if not files:
            raise ConfigError(f"task text: the folder path={path!r} has no .txt file; give --set "
                              f"train.task.path=FILE, a UTF-8 text file or a folder of .txt files")
        try:
            text = "\n\n".join(_read_utf8(f) for f in files)
        except OSError as error:
            raise ConfigError(f"task text: cannot read path={path!r} ({error.strerror or error}); give "
                              f"--set train.task.path=FILE, an existing UTF-8 text file or a folder of .txt "
                              f"files") from None
        cut = int(len(text) * (1 - validation))
        self.splits = {"train": text[:cut], "eval": text[cut:] or text[:cut]}
        shortest = min(len(part) for part in self.splits.values())
        if shortest <= window:
            raise ConfigError(f"task text: {path!r} gives splits of {shortest} characters, not more "
                              f"than window={window}; use a longer file or a smaller window")
        self.window = window

    def example(self, rng: random.Random, split: str = "train") -> tuple[str, str]:
        text = self.splits[split]
        start = rng.randrange(len(text) - self.window)
        return "", text[start:start + self.window]


def _read_utf8(file: Path) -> str:
    """The file's text; bytes that are not UTF-8 become U+FFFD, with one warning that counts them
    and gives the first one's offset (training on replacement characters is never silent)."""
    data = file.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        first = error.start
    text = data.decode("utf-8", errors="surrogateescape")
    bad = sum(1 for c in text if "\udc80" <= c <= "\udcff")
    warnings.warn(f"task text: {file}: {bad:,} byte(s) are not UTF-8 (the first at byte offset {first:,}); each "
                  f"was replaced by U+FFFD", stacklevel=2)
    return data.decode("utf-8", errors="replace")
