"""The ``seqzoo`` command line. Bad input prints one line to stderr and exits 2 (``--debug`` shows
the traceback)."""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

EXIT_BAD_INPUT = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="seqzoo", description="Assemble sequence models from plugins and YAML recipes.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = commands.add_parser("list", help="list registered components")
    p.add_argument("kind", nargs="?", help="only this kind (score, position, norm, ffn, ...)")

    p = commands.add_parser("show", help="print a resolved recipe, its parameter count and module tree")
    p.add_argument("recipe", help="recipe path or shipped recipe name")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")

    p = commands.add_parser("build", help="build a model from a recipe and save it")
    p.add_argument("recipe", help="recipe path or shipped recipe name")
    p.add_argument("-o", "--output", help="checkpoint to write (.safetensors)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--seed", type=int, default=0, help="seed for the random initialisation (0)")

    p = commands.add_parser("generate", help="continue a prompt with a saved model")
    p.add_argument("checkpoint", help="a .safetensors file written by seqzoo")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="text, encoded with the recipe's tokenizer")
    source.add_argument("--ids", help="comma-separated token ids, bypassing the tokenizer")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int)
    p.add_argument("--top-p", type=float)
    p.add_argument("--seed", type=int)
    p.add_argument("--no-cache", action="store_true", help="recompute the prefix every step")
    p.add_argument("--device", help="cpu, cuda, auto (default: the recipe's runtime.device)")
    return parser


def _cmd_list(args) -> int:
    import seqzoo

    reg = seqzoo.registry()
    if args.kind is not None and args.kind not in reg.kinds():
        from .errors import unknown_name

        raise seqzoo.RegistryError(unknown_name("component kind", args.kind, reg.kinds()))
    rows = [(c.kind, c.name, c.summary, c.origin) for c in reg.list(args.kind)]
    widths = [max(len(r[i]) for r in rows) for i in range(2)] if rows else [0, 0]
    for kind, name, summary, origin in rows:
        print(f"{kind:<{widths[0]}}  {name:<{widths[1]}}  {summary}  [{origin}]")
    return 0


def _count(model) -> int:
    """Parameters, each tied tensor counted once (``parameters()`` skips repeats)."""
    return sum(p.numel() for p in model.parameters())


def _cmd_show(args) -> int:
    import yaml

    from .build import instantiate
    from .recipe import resolve

    resolved = resolve(args.recipe, args.overrides)
    model = instantiate(resolved, device="meta")  # structure only: nothing is allocated
    print(yaml.safe_dump(resolved.data, sort_keys=False).rstrip())
    total = _count(model)
    print(f"\nparameters: {total:,}")
    print(f"\n{model}")
    return 0


def _cmd_build(args) -> int:
    import torch

    import seqzoo

    torch.manual_seed(args.seed)
    model = seqzoo.build(args.recipe, args.overrides)
    total = _count(model)
    if args.output:
        seqzoo.save(model, args.output)
        print(f"built {model.recipe['model']['kind']} with {total:,} parameters -> {args.output}")
    else:
        print(f"built {model.recipe['model']['kind']} with {total:,} parameters (use -o FILE to save it)")
    return 0


def _cmd_generate(args) -> int:
    import torch

    import seqzoo

    model = seqzoo.load(args.checkpoint, device=args.device)
    device = next(model.parameters()).device
    tokenizer = seqzoo.tokenizer(model)
    if args.ids is not None:
        try:
            prompt = [int(x) for x in args.ids.split(",") if x.strip()]
        except ValueError:
            raise seqzoo.InputError(f"--ids: expected comma-separated integers, got {args.ids!r}") from None
    else:
        prompt = tokenizer.encode(args.prompt)
    if not prompt:
        raise seqzoo.InputError("the prompt is empty; give at least one token")
    vocab = model.recipe["model"].get("vocab_size")
    bad = [i for i in prompt if i < 0 or (vocab is not None and i >= vocab)]
    if bad:
        raise seqzoo.InputError(f"--ids: token ids {bad[:5]} are outside the vocabulary [0, {vocab})")
    ids = torch.tensor([prompt], device=device)
    out = seqzoo.generate(model, ids, args.max_new_tokens, use_cache=not args.no_cache,
                          temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                          eos_id=tokenizer.eos_id, seed=args.seed)
    new = out[0, len(prompt):].tolist()
    if args.ids is not None:
        print(",".join(str(i) for i in out[0].tolist()))
    else:
        print(args.prompt + tokenizer.decode(new))
    return 0


COMMANDS = {"list": _cmd_list, "show": _cmd_show, "build": _cmd_build, "generate": _cmd_generate}


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from .errors import SeqzooError

    try:
        return COMMANDS[args.command](args)
    except SeqzooError as error:
        if args.debug:
            raise
        print(f"seqzoo: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
