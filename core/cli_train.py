"""``seqzoo train``: train a recipe's model on its ``train:`` task (see ``seqzoo.training``)."""
from __future__ import annotations

import json
import shlex
import sys


def register_cli(add) -> dict:
    """Add the training commands to the CLI; ``add(name, help=...)`` makes a subparser."""
    p = add("train", help="train a recipe's model on its train: task (torchrun-aware)")
    p.add_argument("recipe", help="recipe path or shipped recipe name")
    p.add_argument("-o", "--output", help="checkpoint to write (.safetensors), resumable")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--metrics", metavar="FILE.json", help="write the loss history and evaluation here")
    p.add_argument("--resume", metavar="CKPT", help="continue the run saved in this checkpoint")
    p.add_argument("--until", type=int, metavar="STEP", help="stop after this step (resume later)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return {"train": _cmd_train}


def _cmd_train(args) -> int:
    import torch

    import seqzoo

    from .build import instantiate
    from .errors import InputError
    from .recipe import resolve
    from .training import Distributed, TrainConfig, train

    resolved = resolve(args.recipe, args.overrides)
    if resolved.data["train"] is None:  # no train: section — the defaults, recorded in the recipe
        resolved = resolve(args.recipe, [*args.overrides, "train={}"])
    config = TrainConfig(**{k: v for k, v in resolved.data["train"].items()})
    if args.until is not None and args.until < 1:
        raise InputError(f"--until must be >= 1, got {args.until}")
    dist_info = Distributed.from_env()
    device = None
    if dist_info.world > 1 and torch.cuda.is_available():
        device = f"cuda:{dist_info.local_rank}"
    torch.manual_seed(config.seed)
    if args.resume:
        model = seqzoo.load(args.resume, device=device)
        model.recipe = {**model.recipe, "train": resolved.data["train"]}
    else:
        model = instantiate(resolved, device=device)
    tokenizer = seqzoo.tokenizer(model)
    result = train(model, config, tokenizer, output=args.output, resume=args.resume, until=args.until,
                   quiet=args.quiet, compile=resolved.data["runtime"]["compile"])
    if not dist_info.main:
        return 0
    metrics = {"history": result.history, "eval": result.eval, "example_prompt": result.example_prompt,
               "steps": result.steps, "seconds": round(result.seconds, 2)}
    if args.metrics:
        with open(args.metrics, "w", encoding="utf-8") as handle:
            json.dump(metrics, handle, indent=1)
    summary = f"step {result.steps}: held-out loss {result.eval['loss']:.4f}"
    if "accuracy" in result.eval:
        summary += f", exact match {result.eval['accuracy']:.3f}"
    print(f"{summary} ({result.seconds:.1f} s)", file=sys.stderr if args.quiet else sys.stdout)
    if args.output:
        print(f"saved {args.output}; try it:\n  seqzoo generate {shlex.quote(args.output)} "
              f"--prompt {shlex.quote(result.example_prompt)}")
    return 0
