"""``seqzoo eval CKPT --text FILE [--context N] [--stride S]``: perplexity with the sliding-window
method (see ``seqzoo.train.perplexity``), tokens/s and a progress bar."""
from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from ..errors import InputError


def _cmd_eval(args: argparse.Namespace) -> int:
    from ..io.checkpoint import load
    from ..train.perplexity import evaluate

    path = Path(args.text)
    if not path.is_file():
        raise InputError(f"{path}: no such file (--text takes a UTF-8 text file)")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise InputError(f"{path}: not UTF-8 text ({error})") from None
    model = load(args.checkpoint, device=args.device)
    result = evaluate(model, text, context=args.context, stride=args.stride, progress=not args.quiet)
    print(f"perplexity {result.perplexity:.4f} (nll {result.nll:.4f} nats/token) over {result.tokens:,} tokens, "
          f"{result.windows} window(s) of {result.context} with stride {result.stride}; "
          f"{result.tokens_per_s:,.0f} tokens/s")
    return 0


def register_cli(add: Callable[..., argparse.ArgumentParser]) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Add ``eval`` to the CLI (``add(name, help=...)`` makes a subparser)."""
    p = add("eval", help="perplexity of a causal LM checkpoint on a text file (sliding window)")
    p.add_argument("checkpoint", help="a .safetensors file written by seqzoo")
    p.add_argument("--text", required=True, help="a UTF-8 text file")
    p.add_argument("--context", type=int, help="tokens per window (default: the model's limit, at most 1024)")
    p.add_argument("--stride", type=int, help="tokens between window starts (default: the context)")
    p.add_argument("--device", help="cpu, cuda, auto (default: the recipe's runtime.device)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return {"eval": _cmd_eval}
