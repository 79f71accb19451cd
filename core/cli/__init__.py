"""The ``seqzoo`` command line: ``main`` and the command groups it loads (train, data, compare, plots,
catalog, Hugging Face and GGUF import/export, ...). Nothing heavy is imported until a command runs,
so ``seqzoo --help`` starts in a fraction of a second, and Ctrl-C at any moment ends with one line."""
from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    try:
        from .commands import main as run
    except KeyboardInterrupt:
        print("seqzoo: interrupted", file=sys.stderr)
        return 130
    return run(argv)


__all__ = ["main"]
