"""``seqzoo import-gguf FILE -o CKPT`` and ``seqzoo export-gguf CKPT FILE --type T``: llama.cpp's GGUF
files in and out (``seqzoo.io.gguf``)."""
from __future__ import annotations

from pathlib import Path

import yaml

from ..files import check_output_file, write_text_atomic
from .hf import DTYPES


def register_cli(add):
    """Add ``import-gguf`` and ``export-gguf``; returns {command: handler}."""
    from ..io.gguf_types import WRITABLE

    p = add("import-gguf", help="convert a GGUF file (llama.cpp) into a seqzoo checkpoint (families: docs/gguf.md)")
    p.add_argument("file", help="a .gguf file (F32, F16, BF16 or quantised tensors)")
    p.add_argument("-o", "--output", required=True, help="seqzoo checkpoint to write (.safetensors)")
    p.add_argument("--dtype", choices=DTYPES, default="float32",
                   help="parameter dtype (float32: quantised tensors are dequantised)")
    p.add_argument("--recipe", metavar="FILE.yaml", help="also write the recipe (for `seqzoo show`)")
    p = add("export-gguf", help="write a seqzoo checkpoint as a GGUF file llama.cpp runs (families: docs/gguf.md)")
    p.add_argument("checkpoint", help="a .safetensors file written by seqzoo")
    p.add_argument("file", help="the .gguf file to write")
    # Every type to_gguf writes: F32 (exact), F16, BF16 and the block quantisations.
    p.add_argument("--type", choices=list(WRITABLE), default="F32",
                   help="tensor type of the matrices (F32: exact; norms stay F32)")
    p.add_argument("--model-type", help="the Hugging Face family to write it as, where several fit (phi3, ...)")
    return {"import-gguf": cmd_import_gguf, "export-gguf": cmd_export_gguf}


def cmd_import_gguf(args) -> int:
    """``seqzoo import-gguf FILE.gguf -o CKPT [--dtype D] [--recipe FILE.yaml]``."""
    from ..io.checkpoint import save
    from ..io.gguf import from_gguf, gguf_summary

    model = from_gguf(args.file, device="cpu", dtype=args.dtype)
    if args.recipe:
        write_text_atomic(Path(args.recipe), yaml.safe_dump(model.recipe, sort_keys=False))
    save(model, args.output)
    print(f"imported {gguf_summary(args.file)} with {sum(p.numel() for p in model.parameters()):,} parameters "
          f"-> {args.output}")
    return 0


def cmd_export_gguf(args) -> int:
    """``seqzoo export-gguf CKPT FILE.gguf [--type T]``."""
    from ..io.checkpoint import load
    from ..io.gguf import gguf_summary, to_gguf

    check_output_file(args.file, "model.gguf")  # before the checkpoint loads (to_gguf checks it too)
    out = to_gguf(load(args.checkpoint, device="cpu"), args.file, dtype=args.type, model_type=args.model_type)
    print(f"exported {args.checkpoint} as {gguf_summary(out)} -> {out}")
    return 0
