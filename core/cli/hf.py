"""``seqzoo import-hf DIR -o FILE`` and ``seqzoo export-hf CKPT DIR``: Hugging Face folders in and out
(``seqzoo.io.hf``)."""
from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import yaml

from ..files import write_text_atomic

DTYPES = ["float32", "float16", "bfloat16", "float64"]


def register_cli(add: Callable[..., argparse.ArgumentParser]) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Add ``import-hf`` and ``export-hf`` (``add(name, help=...)`` makes a subparser); returns
    {command: handler}. A handler takes the parsed namespace and returns the exit code; bad input
    raises a SeqzooError."""
    p = add("import-hf", help="convert a Hugging Face checkpoint folder into a seqzoo checkpoint")
    p.add_argument("folder", help="config.json + model.safetensors (sharded or not) [+ tokenizer.json]")
    p.add_argument("-o", "--output", required=True, help="seqzoo checkpoint to write (.safetensors)")
    p.add_argument("--dtype", choices=DTYPES, help="parameter dtype (default: the stored weights' dtype)")
    p.add_argument("--recipe", metavar="FILE.yaml", help="also write the recipe (for `seqzoo show`)")
    p = add("export-hf", help="write a seqzoo checkpoint as a Hugging Face folder")
    p.add_argument("checkpoint", help="a .safetensors file written by seqzoo")
    p.add_argument("folder", help="output folder (created if missing)")
    p.add_argument("--model-type", help="the Hugging Face family (default: the one that fits)")
    return {"import-hf": cmd_import_hf, "export-hf": cmd_export_hf}


def cmd_import_hf(args: argparse.Namespace) -> int:
    """``seqzoo import-hf DIR -o FILE.safetensors [--dtype D] [--recipe FILE.yaml]``."""
    from ..io.checkpoint import save
    from ..io.hf import CONFIG, from_hf

    model = from_hf(args.folder, device="cpu", dtype=args.dtype)
    if args.recipe:
        write_text_atomic(Path(args.recipe), yaml.safe_dump(model.recipe, sort_keys=False))
    save(model, args.output)
    total = sum(p.numel() for p in model.parameters())
    family = json.loads((Path(args.folder) / CONFIG).read_text(encoding="utf-8"))["model_type"]
    print(f"imported {family} as {model.recipe['model']['kind']} with {total:,} parameters -> {args.output}")
    return 0


def cmd_export_hf(args: argparse.Namespace) -> int:
    """``seqzoo export-hf CKPT DIR [--model-type T]``."""
    from ..io.checkpoint import load
    from ..io.hf import CONFIG, to_hf

    model = load(args.checkpoint, device="cpu")
    folder = to_hf(model, args.folder, model_type=args.model_type)
    family = json.loads((folder / CONFIG).read_text(encoding="utf-8"))["model_type"]
    print(f"exported {args.checkpoint} as {family} -> {folder}")
    return 0
