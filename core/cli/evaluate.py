"""``seqzoo eval CKPT --text FILE [--context N] [--stride S]``: perplexity with the sliding-window
method (see ``seqzoo.train.perplexity``), tokens/s and a progress bar; ``seqzoo eval CKPT --tasks
NAME[,NAME]``: lm-evaluation-harness tasks through ``seqzoo.lab.harness``."""
from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from ..errors import InputError
from ..files import check_output_file, write_text_atomic
from .options import at_least

#: Rows per forward pass of lm-eval (--batch-size), when not given.
BATCH_SIZE = 8


def _cmd_eval(args: argparse.Namespace) -> int:
    if (args.text is None) == (args.tasks is None):
        raise InputError("seqzoo eval: give --text FILE (perplexity) or --tasks NAME[,NAME] (lm-eval), one of them")
    # 0 must not stand for "the default" (the perplexity window reads a 0 as unset)
    at_least(2, ("--context", args.context))
    at_least(1, ("--stride", args.stride), ("--limit", args.limit), ("--batch-size", args.batch_size))
    at_least(0, ("--num-fewshot", args.num_fewshot))
    # An option of the other mode would be ignored without a word; say so instead
    if args.text is not None:
        mode, other = "--text", "--tasks (lm-eval)"
        options = {"--include-path": args.include_path, "--limit": args.limit, "--num-fewshot": args.num_fewshot,
                   "--batch-size": args.batch_size, "--output": args.output}
    else:
        mode, other = "--tasks", "--text (perplexity)"
        options = {"--context": args.context, "--stride": args.stride}
    ignored = [flag for flag, value in options.items() if value is not None]
    if ignored:
        one = len(ignored) == 1
        raise InputError(f"seqzoo eval: {', '.join(ignored)} {'applies' if one else 'apply'} to {other}, not "
                         f"{mode}; drop {'it' if one else 'them'}")
    if args.output is not None:  # said now, not after lm-eval's run
        check_output_file(args.output, "results.json", "-o")
    return _perplexity(args) if args.text is not None else _harness(args)


def _perplexity(args: argparse.Namespace) -> int:
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


def _harness(args: argparse.Namespace) -> int:
    from ..lab.harness import evaluate, table

    if args.include_path is not None and not Path(args.include_path).is_dir():
        raise InputError(f"{args.include_path}: no such folder (--include-path takes a folder of lm-eval task YAMLs)")
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if not tasks:
        raise InputError("seqzoo eval: --tasks is empty; give task names, e.g. --tasks arc_easy,hellaswag")
    batch_size = BATCH_SIZE if args.batch_size is None else args.batch_size
    results = evaluate(args.checkpoint, tasks, include_path=args.include_path, batch_size=batch_size,
                       limit=args.limit, num_fewshot=args.num_fewshot, device=args.device)
    print(table(results))
    if args.output:
        kept = {key: results[key] for key in ("results", "versions", "n-shot", "configs", "samples") if key in results}
        write_text_atomic(Path(args.output), json.dumps(kept, indent=1, default=str))
        print(f"wrote {args.output}")
    return 0


def register_cli(add: Callable[..., argparse.ArgumentParser]) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Add ``eval`` to the CLI (``add(name, help=...)`` makes a subparser)."""
    p = add("eval", help="perplexity on a text file (--text), or lm-evaluation-harness tasks (--tasks)")
    p.add_argument("checkpoint", help="a .safetensors file written by seqzoo")
    p.add_argument("--text", help="a UTF-8 text file: perplexity with a sliding window")
    p.add_argument("--context", type=int, help="tokens per window (default: the model's limit, at most 1024)")
    p.add_argument("--stride", type=int, help="tokens between window starts (default: the context)")
    p.add_argument("--tasks", metavar="NAME[,NAME]", help="lm-eval tasks to run (pip install 'seqzoo[eval]')")
    p.add_argument("--include-path", metavar="DIR", help="a folder of local lm-eval task YAMLs")
    p.add_argument("--limit", type=int, help="at most this many documents per task")
    p.add_argument("--num-fewshot", type=int, help="few-shot examples per prompt (default: the task's)")
    p.add_argument("--batch-size", type=int, help=f"lm-eval rows per forward pass ({BATCH_SIZE})")
    p.add_argument("-o", "--output", metavar="FILE.json", help="also write lm-eval's results and samples")
    p.add_argument("--device", help="cpu, cuda, auto (default: the recipe's runtime.device)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return {"eval": _cmd_eval}
