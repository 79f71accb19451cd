"""``seqzoo train``: train a recipe's model on its ``train:`` task (see ``seqzoo.train.training``)."""
from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

from ..errors import CheckpointError, ConfigError, InputError
from ..files import file_in_the_way, refuse_folder, write_text_atomic
from ..schema import dotted
from ..schema import instantiate as instantiate_section
from .checkpoints import refuse_to_replace
from .options import add_set


def register_cli(add) -> dict:
    """Add the training commands to the CLI; ``add(name, help=...)`` makes a subparser."""
    p = add("train", help="train a recipe's model on its train: task (torchrun-aware)")
    p.add_argument("recipe", nargs="?",
                   help="recipe path or shipped recipe name (with --resume or --init: the checkpoint's "
                        "own recipe when omitted)")
    p.add_argument("-o", "--output", help="checkpoint to write (.safetensors), resumable (default: "
                                          "runs/RECIPE.safetensors, or RECIPE-2, -3, ... when that is taken)")
    p.add_argument("--force", action="store_true", help="replace the -o file if it exists (it is refused otherwise)")
    add_set(p)
    p.add_argument("--metrics", metavar="FILE.json", help="write the loss history and evaluation here")
    start = p.add_mutually_exclusive_group()
    start.add_argument("--resume", metavar="CKPT", help="continue the run saved in this checkpoint")
    start.add_argument("--init", metavar="CKPT",
                       help="start from this checkpoint's weights and tokenizer (fine-tuning; also train.init)")
    p.add_argument("--until", type=int, metavar="STEP", help="stop after this step (resume later)")
    p.add_argument("--data", metavar="DIR",
                   help="train on token shards from `seqzoo data prepare` (the task tokens with path DIR)")
    p.add_argument("--log-dir", metavar="DIR",
                   help="write metrics.jsonl (and TensorBoard event files, when installed) here")
    p.add_argument("--threads", type=int, metavar="N", help="CPU threads (also runtime.threads; default: all cores)")
    p.add_argument("--weights-only", action="store_true",
                   help="save the final checkpoint without optimizer state: a third of the size, for sharing, "
                        "not resumable")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return {"train": _cmd_train}


def apply_threads(threads: int | None) -> None:
    """``--threads`` / ``runtime.threads``: torch's CPU threads (unset: torch's default)."""
    import torch

    if threads is not None:
        if threads < 1:
            raise InputError(f"--threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)


#: The recipe sections a resumed run must share with its checkpoint (the train: settings may change).
RESUME_KEYS = (("model",), ("tokenizer",), ("train", "task"))


def first_difference(a, b, path: tuple = ()) -> tuple | None:
    """The first key path (depth first, in ``a``'s order) where nested data ``a`` and ``b`` differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in [*a, *(k for k in b if k not in a)]:
            found = first_difference(a.get(key), b.get(key), (*path, key))
            if found is not None:
                return found
        return None
    return None if a == b else path


def _lookup(data: dict, path: tuple):
    for key in path:
        data = data.get(key) if isinstance(data, dict) else None
    return data


def _check_resume(given: dict, saved: dict, checkpoint: str, recipe: str) -> list[str]:
    """Refuse a recipe that describes another run than the checkpoint's; return the train: changes."""
    for section in RESUME_KEYS:
        where = first_difference(_lookup(given, section), _lookup(saved, section), section)
        if where is not None:
            raise InputError(
                f"--resume {checkpoint}: {recipe} differs from the checkpoint's recipe at {dotted(where)} "
                f"({_lookup(given, where)!r} here, {_lookup(saved, where)!r} in the checkpoint); a resumed "
                f"run keeps its model, tokenizer and task — drop the recipe to use the checkpoint's, or "
                f"start a new run with --init {checkpoint}")
    changes = []
    given_train, saved_train = given.get("train") or {}, saved.get("train") or {}
    for key in given_train:
        if key != "task" and given_train[key] != saved_train.get(key):
            changes.append(f"train.{key}: {saved_train.get(key)!r} -> {given_train[key]!r}")
    return changes


def _init_from(model, checkpoint: str) -> None:
    """Fine-tuning: ``model`` (built from the run's recipe) takes the checkpoint's weights, which
    must fit it tensor for tensor, and the checkpoint's tokenizer."""
    from ..io.checkpoint import load_weights, read_metadata, read_recipe

    metadata = read_metadata(checkpoint)
    saved = read_recipe(checkpoint, metadata)
    load_weights(model, checkpoint, metadata, same_dtype=False)
    model.recipe = {**model.recipe, "tokenizer": saved.get("tokenizer", model.recipe["tokenizer"])}
    if "seqzoo.tokenizer" in metadata:
        model.tokenizer_state = metadata["seqzoo.tokenizer"]


#: Where ``seqzoo train`` saves a run given no -o.
RUNS = "runs"


def default_output(recipe: str) -> str:
    """``runs/NAME.safetensors`` for a recipe path or shipped name (a checkpoint: its stem), or the
    first of ``runs/NAME-2.safetensors``, ``-3``, ... that does not exist yet."""
    name = Path(recipe).name
    for suffix in (".safetensors", ".yaml", ".yml"):
        name = name.removesuffix(suffix)
    candidate, number = Path(RUNS) / f"{name}.safetensors", 2
    while candidate.exists():
        candidate, number = Path(RUNS) / f"{name}-{number}.safetensors", number + 1
    return str(candidate)


def _check_logs(metrics: str | None, log_dir: str | None) -> None:
    """Refuse a --metrics file or --log-dir folder that cannot be written, before training: the
    metrics are written after the last step, and a run must not end with nowhere to put them.
    Missing folders are made (--metrics often goes inside the --log-dir the run creates)."""
    if metrics is not None:
        refuse_folder(metrics, "metrics.json", "--metrics")
        _refuse_file_in_path(Path(metrics).parent, f"--metrics {metrics}", "metrics.json")
    if log_dir is not None:
        _refuse_file_in_path(Path(log_dir), f"--log-dir {log_dir}", "")


def _refuse_file_in_path(folder: Path, given: str, name: str) -> None:
    """Refuse a folder to be made where a file stands (it or the nearest existing folder above it)."""
    file = file_in_the_way(folder)
    if file is not None:
        raise InputError(f"{given}: {file} is a file, not a folder; give a folder (created if missing) such "
                         f"as {Path(f'{file}-logs', name)}")


def _cmd_train(args) -> int:
    import torch

    from ..config import TrainConfig
    from ..interfaces import MaskedLanguageModel
    from ..io.build import instantiate
    from ..io.checkpoint import load, read_metadata, read_recipe
    from ..recipe import resolve
    from ..registry import tokenizer
    from ..train.distributed import Distributed
    from ..train.token_batches import data_override, fit_window
    from ..train.training import check_resumable, held_out_summary, train

    checkpoint = args.resume or args.init
    if args.recipe is None and checkpoint is None:
        raise InputError("seqzoo train: give a recipe (a path or a shipped name such as tiny-gpt), or "
                         "--resume/--init CKPT to use a checkpoint's own recipe")
    # A resumed run writes back to the checkpoint it resumed unless -o says otherwise, and a run
    # without -o still ends somewhere (as HF's Trainer has its output_dir, litgpt its out_dir):
    # work is never dropped because an option was left out, nor written over unasked.
    output = args.output or args.resume or default_output(args.recipe or checkpoint)
    if output != args.resume:
        refuse_to_replace(output, force=args.force, resumable=True)
    _check_logs(args.metrics, args.log_dir)
    source = args.recipe if args.recipe is not None else read_recipe(checkpoint)
    label = None if args.recipe is not None else checkpoint
    overrides = list(args.overrides)
    if args.data is not None:  # before the overrides, which may set the data task's own keys (seq_len)
        overrides.insert(0, data_override(resolve(source, label=label).data["train"], args.data))
    resolved = resolve(source, overrides, label=label)
    if resolved.data["train"] is None:  # no train: section — the defaults, recorded in the recipe
        overrides.insert(0, "train={}")
        resolved = resolve(source, overrides, label=label)
    if args.data is not None:
        fitted = fit_window(resolved.data, args.overrides)
        if fitted:
            resolved = resolve(source, overrides + fitted, label=label)
    apply_threads(args.threads if args.threads is not None else resolved.data["runtime"].get("threads"))
    config = instantiate_section(resolved.data["train"], TrainConfig)  # nested sections (lora) as dataclasses
    if args.until is not None and args.until < 1:
        raise InputError(f"--until must be >= 1, got {args.until}")
    dist_info = Distributed.from_env()
    device = None
    if dist_info.world > 1 and torch.cuda.is_available():
        device = f"cuda:{dist_info.local_rank}"
    torch.manual_seed(config.seed)
    if args.resume:
        check_resumable(args.resume, read_metadata(args.resume))
        model = load(args.resume, device=device)
        for change in _check_resume(resolved.data, model.recipe, args.resume, args.recipe or "--set"):
            print(f"resume: {change}", file=sys.stderr)
        model.recipe = {**model.recipe, "train": resolved.data["train"]}
    else:
        model = instantiate(resolved, device=device)
        init = args.init or config.init
        if init is not None:
            try:
                _init_from(model, init)
            except CheckpointError as error:
                if args.init:
                    raise
                raise resolved.error(("train", "init"), str(error)) from None
            print(f"init: weights and tokenizer from {init}", file=sys.stderr)
    if output != args.resume and not args.output:
        os.makedirs(os.path.dirname(output), exist_ok=True)
    try:
        result = train(model, config, tokenizer(model), output=output, resume=args.resume, until=args.until,
                       quiet=args.quiet, compile=resolved.data["runtime"]["compile"], log_dir=args.log_dir,
                       weights_only=args.weights_only)
    except ConfigError as error:  # a train: setting the model or task refuses (the task's min_len > max_len)
        raise resolved.error(resolved.path_of(error.spec, ("train",)), str(error)) from None
    if not dist_info.main:
        return 0
    metrics = {"history": result.history, "eval": result.eval, "example_prompt": result.example_prompt,
               "steps": result.steps, "seconds": round(result.seconds, 2), "flops_per_token": result.flops_per_token,
               "precision": result.precision}
    if args.metrics:
        Path(args.metrics).parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(Path(args.metrics), json.dumps(metrics, indent=1))
    print(f"step {result.steps}: {held_out_summary(result.eval)} ({result.seconds:.1f} s)",
          file=sys.stderr if args.quiet else sys.stdout)
    if output:
        what = "weights only" if args.weights_only else "resumable"
        command = "fill-mask" if isinstance(model, MaskedLanguageModel) else "generate"
        option = "--text" if command == "fill-mask" else "--prompt"
        # The plugins this run was given are needed to load what it saved.
        plugins = "".join(f" --plugin {shlex.quote(p)}" for p in [*args.plugins, *(args.plugins_after or [])])
        print(f"saved {output} ({what}); try it:\n  seqzoo{plugins} {command} {shlex.quote(output)} "
              f"{option} {shlex.quote(result.example_prompt)}")
    return 0
