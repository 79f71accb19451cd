"""``seqzoo fill-mask CKPT --text "Paris is the [MASK] of France."``: the top predictions for each
mask token of a text, with their probabilities (see ``seqzoo.nn.fill_mask``)."""
from __future__ import annotations

import argparse
from collections.abc import Callable

from ..errors import InputError


def _cmd_fill_mask(args: argparse.Namespace) -> int:
    from ..io.checkpoint import load
    from ..nn.fill_mask import fill_mask

    if args.top_k < 1:
        raise InputError(f"--top-k must be >= 1, got {args.top_k}")
    model = load(args.checkpoint, device=args.device)
    masks = fill_mask(model, args.text, top_k=args.top_k)
    print(args.text)
    for number, predictions in enumerate(masks, 1):
        print(f"mask {number} of {len(masks)}:")
        for p in predictions:
            print(f"  {p.probability:.4f}  {p.token!r}")
    return 0


def register_cli(add: Callable[..., argparse.ArgumentParser]) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Add ``fill-mask`` to the CLI (``add(name, help=...)`` makes a subparser)."""
    p = add("fill-mask", help="predict the masked tokens of a text with a masked-LM checkpoint (BERT, RoBERTa)")
    p.add_argument("checkpoint", help="a .safetensors file written by seqzoo, with an MLM head")
    p.add_argument("--text", required=True,
                   help="text with the tokenizer's mask token: [MASK] (BERT), <mask> (RoBERTa)")
    p.add_argument("--top-k", type=int, default=5, help="predictions per mask (5)")
    p.add_argument("--device", help="cpu, cuda, auto (default: the recipe's runtime.device)")
    return {"fill-mask": _cmd_fill_mask}
