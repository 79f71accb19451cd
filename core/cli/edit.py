"""``seqzoo edit SRC --set key=value ... -o OUT [--dry-run]``: change a trained model's recipe and
carry its weights across with the transfer rules (see ``seqzoo.train.surgery``). SRC is a seqzoo
checkpoint, a Hugging Face folder or a llama GGUF file."""
from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import yaml

from ..errors import InputError
from ..files import write_text_atomic


def load_any(source: str):
    """A model from a seqzoo checkpoint, a Hugging Face folder or a .gguf file."""
    from ..io.checkpoint import load
    from ..io.gguf import from_gguf
    from ..io.hf import from_hf

    path = Path(source)
    if path.is_dir():
        return from_hf(path, device="cpu")
    if path.suffix == ".gguf":
        return from_gguf(path, device="cpu")
    if not path.is_file():
        raise InputError(f"{path}: no such checkpoint, folder or GGUF file")
    return load(path, device="cpu")


def _cmd_edit(args: argparse.Namespace) -> int:
    from ..io.checkpoint import save
    from ..train.surgery import edit

    if not args.set:
        raise InputError("edit: nothing to change; give --set key=value (model.attention.kv_heads=1, ...)")
    if not args.dry_run and not args.output:
        raise InputError("edit: give -o OUT.safetensors (or --dry-run to see the plan)")
    model = load_any(args.source)
    edited, report = edit(model, args.set, dry_run=args.dry_run)
    for line in report.lines():
        print(line)
    if edited is not None:
        save(edited, args.output)
        if args.recipe:
            write_text_atomic(Path(args.recipe), yaml.safe_dump(edited.recipe, sort_keys=False))
        print(f"-> {args.output}" + (f" (recipe: {args.recipe})" if args.recipe else ""))
    return 0


def register_cli(add: Callable[..., argparse.ArgumentParser]) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Add ``edit`` to the CLI (``add(name, help=...)`` makes a subparser)."""
    p = add("edit", help="change a trained model's recipe, carrying its weights with transfer rules")
    p.add_argument("source", help="a seqzoo checkpoint, a Hugging Face folder or a .gguf file")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="a recipe change (repeatable)")
    p.add_argument("-o", "--output", help="the edited checkpoint (.safetensors)")
    p.add_argument("--dry-run", action="store_true", help="print the plan (tensors copied, made, initialised)")
    p.add_argument("--recipe", metavar="FILE.yaml", help="also write the edited recipe (to train it with --init)")
    return {"edit": _cmd_edit}
