"""``seqzoo compare RECIPE... [--contenders FILE] --data DIR (--steps N | --tokens N)``: several
recipes — or contenders, each a recipe with its own overrides (``seqzoo.lab.contenders``) — trained
side by side on the same data and budget, tabulated (``seqzoo.lab.compare``)."""
from __future__ import annotations

import sys

from ..errors import InputError
from .options import add_set


def register_cli(add) -> dict:
    p = add("compare", help="train several recipes on the same data and budget; a table and figures")
    p.add_argument("recipes", nargs="*", metavar="RECIPE", help="recipe paths or shipped recipe names")
    p.add_argument("--contenders", action="append", default=[], metavar="FILE",
                   help="a YAML file of contenders, each a name, a recipe and its own --set overrides (the "
                        "training recipe too: train.optimizer, train.lr, ...); repeatable, after the RECIPEs")
    p.add_argument("--data", metavar="DIR", help="token shards from `seqzoo data prepare` (default: each recipe's "
                                                 "own train.task, which must be the same)")
    budget = p.add_mutually_exclusive_group(required=True)
    budget.add_argument("--steps", type=int, metavar="N", help="optimizer steps per run")
    budget.add_argument("--tokens", type=int, metavar="N", help="training tokens per run (token tasks)")
    p.add_argument("--seeds", default="0", metavar="S[,S...]", help="seeds, comma-separated (0)")
    p.add_argument("--match-params", action="store_true",
                   help="solve each model's FFN width to the first recipe's parameter count")
    p.add_argument("--workers", type=int, default=1, metavar="K", help="runs at a time, each a process (1)")
    p.add_argument("--threads", type=int, metavar="N", help="CPU threads per run (default: the cores / K)")
    add_set(p, "an override for every recipe, KEY.PATH=VALUE with the value read as YAML (repeatable)")
    p.add_argument("--report-only", action="store_true",
                   help="train nothing: rewrite the table and figures from the runs in OUT that have finished")
    p.add_argument("-o", "--output", default="compare", metavar="OUT",
                   help="folder for the runs, results.json, results.md and the figures (compare)")
    return {"compare": _cmd_compare}


def parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise InputError(f"--seeds: expected comma-separated integers, got {text!r}") from None
    if not seeds or any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise InputError(f"--seeds: give distinct non-negative integers, got {text!r}")
    return seeds


def _cmd_compare(args) -> int:
    from ..lab.compare import compare  # the lab imports plotting and the trainer
    from ..lab.contenders import with_contenders

    for flag, value in (("--steps", args.steps), ("--tokens", args.tokens), ("--workers", args.workers),
                        ("--threads", args.threads)):
        if value is not None and value < 1:
            raise InputError(f"{flag} must be >= 1, got {value}")
    if not args.recipes and not args.contenders:
        raise InputError("seqzoo compare: give the recipes to compare, or --contenders FILE")
    if args.data is not None and not args.report_only:  # here, not once in every run's log
        from ..data.shards import DataError, read_manifest

        try:
            read_manifest(args.data)
        except DataError as error:
            raise DataError(f"{error} (--report-only tabulates finished runs without it)") from None
    arms = with_contenders(args.recipes, args.contenders)
    results = compare(arms, args.output, steps=args.steps, tokens=args.tokens, seeds=parse_seeds(args.seeds),
                      data=args.data, overrides=args.overrides, match_params=args.match_params,
                      workers=args.workers, threads=args.threads, report_only=args.report_only,
                      log=lambda message: print(message, file=sys.stderr, flush=True))
    from ..lab.compare_results import markdown

    print(markdown(results))
    written = ", ".join([f"{args.output}/results.json", f"{args.output}/results.md", *results["figures"]])
    print(f"\nwrote {written}")
    if "figures_skipped" in results:  # the README promises loss curves: never drop them unsaid
        print(f"seqzoo: note: no loss curves drawn: {results['figures_skipped']}; then run the same command "
              f"again (the finished runs are kept, only the table and figures are redone)", file=sys.stderr)
    return 0
