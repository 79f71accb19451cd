"""The ``seqzoo`` command line. Bad input prints one line to stderr and exits 2 (``--debug`` shows
the traceback)."""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import itertools
import os
import re
import sys
import warnings
from collections.abc import Sequence

import yaml

from ..errors import InputError, RegistryError, SeqzooError, TrainingInterrupted, unknown_name
from .checkpoints import refuse_to_replace
from .describe import describe
from .options import add_set

EXIT_BAD_INPUT = 2
EXIT_CHECK_FAILED = 1

# Modules that add commands through ``register_cli(add) -> {name: handler}``.
EXTENSIONS = ("seqzoo.cli.train", "seqzoo.cli.data", "seqzoo.cli.compare", "seqzoo.cli.checkpoints", "seqzoo.cli.plots",
              "seqzoo.cli.hf", "seqzoo.cli.gguf", "seqzoo.cli.catalog", "seqzoo.cli.fill_mask", "seqzoo.cli.evaluate",
              "seqzoo.cli.edit")

PLUGIN_HELP = ("load a local plugin: a .py file or a module name (repeatable; also SEQZOO_PLUGINS, "
               "separated by os.pathsep)")


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors (an unknown option, a value of the wrong type) in one line, as
    every other seqzoo error is, instead of the usage block; ``--help`` still shows the usage.
    Subcommands' parsers are of this class too (``add_subparsers`` makes them of the parent's)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="seqzoo", description="Assemble sequence models from plugins and YAML recipes.",
        epilog="Installed plugins (entry-point group 'seqzoo') load on first use; "
               "SEQZOO_DISABLE_PLUGINS=1 (or a comma list of names) turns them off, "
               "SEQZOO_STRICT_PLUGINS=1 makes a broken plugin an error.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    parser.add_argument("--plugin", dest="plugins", action="append", default=[], metavar="PATH_OR_MODULE",
                        help=PLUGIN_HELP)
    # The same option after the command name (``seqzoo list --plugin x.py``); a distinct dest,
    # because a subparser's default would overwrite the value given before the command.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--plugin", dest="plugins_after", action="append", metavar="PATH_OR_MODULE",
                        help=PLUGIN_HELP)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    add = lambda name, **kw: commands.add_parser(name, parents=[common], **kw)  # noqa: E731

    p = add("list", help="list registered components: kind, name, summary, origin (with KIND NAME: "
                         "one component in full); `list recipes`: the shipped recipes with their sizes")
    p.add_argument("kind", nargs="?", help="only this kind (score, position, norm, ffn, ...), or recipes")
    p.add_argument("name", nargs="?", help="show this component in full: parameters with types and "
                                           "defaults, aliases, origin, docstring")

    p = add("plugins", help="list plugins with their origin, hooks and component counts")
    p.add_argument("-a", "--all", action="store_true", help="one row per built-in module too")

    p = add("check", help="run the conformance kit on registered components (exit 1 on a failure)")
    p.add_argument("kind", nargs="?", help="only this kind (default: every kind the kit checks)")
    p.add_argument("name", nargs="?", help="only this component")
    p.add_argument("--from", dest="origin", metavar="PLUGIN",
                   help="only components from this plugin or distribution")

    p = add("show", help="print a resolved recipe, its parameter count and module tree")
    p.add_argument("recipe", help="recipe path or shipped recipe name")
    add_set(p)

    p = add("build", help="build a model from a recipe and save it")
    p.add_argument("recipe", help="recipe path or shipped recipe name")
    p.add_argument("-o", "--output", help="checkpoint to write (.safetensors)")
    p.add_argument("--force", action="store_true", help="replace the -o file if it exists (it is refused otherwise)")
    add_set(p)
    p.add_argument("--seed", type=int, default=0, help="seed for the random initialisation (0)")

    p = add("generate", help="continue a prompt with a saved model")
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
    p.add_argument("--beam-size", type=int, help="beam search with this many beams")
    p.add_argument("--compile", action="store_true",
                   help="decode through a torch.compile'd static-cache step (decoder-only models; "
                        "pays a one-off compilation, worth it for long outputs)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                   help="cast the weights to this type first (default: as stored)")
    p.add_argument("--quantize", choices=["int8", "int8-dynamic"],
                   help="int8 linear layers: int8 = weight-only (torchao), int8-dynamic = int8 weights and "
                        "per-token int8 inputs, integer products (the CPU; fastest, least exact)")

    for module in EXTENSIONS:  # command groups that live beside the code they drive
        COMMANDS.update(importlib.import_module(module).register_cli(add))
    return parser


def _cmd_list(args) -> int:
    from ..registry import registry

    if args.kind == "recipes" and args.name is None:
        return _list_recipes()
    reg = registry()
    if args.kind is not None and args.kind not in reg.kinds():
        raise RegistryError(unknown_name("component kind", args.kind, reg.kinds()))
    if args.name is not None:
        print(describe(reg.get(args.kind, args.name)))
        return 0
    rows = [(c.kind, c.name, c.summary, c.origin) for c in reg.list(args.kind)]
    widths = [max(len(r[i]) for r in rows) for i in range(2)] if rows else [0, 0]
    for kind, name, summary, origin in rows:
        print(f"{kind:<{widths[0]}}  {name:<{widths[1]}}  {summary}  [{origin}]")
    return 0


def _list_recipes() -> int:
    """The shipped recipes: name, model kind, parameters (counted on the meta device, nothing
    allocated) and the first line of the recipe's own description."""
    import importlib.resources

    from ..io.build import build
    from ..recipe import shipped_recipes

    rows = []
    for name in shipped_recipes():
        text = (importlib.resources.files("seqzoo.recipes") / f"{name}.yaml").read_text(encoding="utf-8")
        lines = iter(text.splitlines())
        comment = itertools.takewhile(lambda line: line.startswith("#"), lines)
        about = " ".join(line.lstrip("# ").strip() for line in comment)
        about = re.split(r": |\.\s+(?=[A-Z])", about)[0].rstrip(".")  # its first clause
        model = build(name, device="meta")
        rows.append((name, model.recipe["model"]["kind"], f"{_count(model):,}", about))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for name, kind, count, about in rows:
        print(f"{name:<{widths[0]}}  {kind:<{widths[1]}}  {count:>{widths[2]}}  {about}")
    return 0


def _counts(components) -> str:
    by_kind: dict[str, int] = {}
    for c in components:
        by_kind[c.kind] = by_kind.get(c.kind, 0) + 1
    detail = ", ".join(f"{k} {n}" for k, n in sorted(by_kind.items()))
    return f"{len(components)} ({detail})" if detail else "0"


def _cmd_plugins(args) -> int:
    from ..registry import registry

    reg = registry()
    plugins = list(reg.plugins.values())
    builtins = [p for p in plugins if p.source == "built-in"]
    rows = [("PLUGIN", "ORIGIN", "STATUS", "HOOKS", "COMPONENTS")]
    if builtins and not args.all:
        hooks = sorted({h for p in builtins for h in p.hooks})
        first = builtins[0]
        rows.append((f"seqzoo.plugins ({len(builtins)} modules)", f"{first.distribution} {first.version} built-in",
                     "loaded", ",".join(hooks), _counts([c for p in builtins for c in p.components])))
        plugins = [p for p in plugins if p.source != "built-in"]
    for p in plugins:
        origin = f"{p.distribution} {p.version}".strip() if p.distribution else ""
        origin = f"{origin} {p.source}".strip() if p.source != "entry point" else origin or "-"
        detail = _counts(p.components) if p.status == "loaded" else p.reason
        rows.append((p.name, origin, p.status, ",".join(p.hooks) or "-", detail))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for row in rows:
        print("  ".join(f"{cell:<{w}}" for cell, w in zip(row, widths)) + "  " + row[4])
    return 0


def _cmd_check(args) -> int:
    from .. import testing
    from ..registry import canonical_name, registry

    reg = registry()
    if args.kind is None:
        kinds = [k for k in testing.CHECKED_KINDS if k in reg.kinds()]
    else:
        if args.kind not in reg.kinds():
            raise RegistryError(unknown_name("component kind", args.kind, reg.kinds()))
        if args.kind not in testing.CHECKED_KINDS:
            raise InputError(f"the conformance kit has no checks for kind {args.kind!r}; it checks "
                             f"{', '.join(testing.CHECKED_KINDS)}")
        kinds = [args.kind]
    if args.name is not None:
        components = [reg.get(kinds[0], args.name)]
    else:
        components = [c for kind in kinds for c in reg.list(kind)]
    if args.origin is not None:
        wanted = {canonical_name(args.origin)}
        if os.path.exists(args.origin):  # a local plugin is named by its resolved path
            wanted.add(canonical_name(os.path.realpath(args.origin)))
        components = [c for c in components if wanted & {canonical_name(c.plugin), canonical_name(c.distribution)}]
        if not components:
            raise InputError(f"--from {args.origin}: no checked component comes from a plugin or "
                             f"distribution of that name (see `seqzoo plugins`)")
    tally = {"passed": 0, "failed": 0, "skipped": 0}
    for component in components:
        results = testing.check_component(component.kind, component.name)
        for result in [*results, *testing.component_warnings(component.kind, component.name)]:
            # Warnings are printed but not tallied: the closing line's format is parsed by CI.
            if result.status in tally:
                tally[result.status] += 1
            print(result, flush=True)
    print(f"{tally['passed']} passed, {tally['failed']} failed, {tally['skipped']} skipped "
          f"({len(components)} component{'' if len(components) == 1 else 's'})")
    return EXIT_CHECK_FAILED if tally["failed"] else 0


def _count(model) -> int:
    """Parameters, each tied tensor counted once (``parameters()`` skips repeats)."""
    return sum(p.numel() for p in model.parameters())


def _cmd_show(args) -> int:
    from ..builder.layout import describe_layout
    from ..io.build import instantiate
    from ..recipe import resolve

    resolved = resolve(args.recipe, args.overrides)
    model = instantiate(resolved, device="meta")  # structure only: nothing is allocated
    print(yaml.safe_dump(resolved.data, sort_keys=False).rstrip())
    layout = describe_layout(resolved.data["model"])
    if layout is not None:  # a heterogeneous stack: which layers are which, in one line
        print(f"\n{layout}")
    total = _count(model)
    active = total - inactive_parameters(model)
    print(f"\nparameters: {total:,}" + (f" ({active:,} active per token)" if active != total else ""))
    print(f"\n{model}")
    return 0


def inactive_parameters(model) -> int:
    """Parameters a token does not go through: the experts a mixture does not route it to."""
    from ..interfaces import FeedForward

    return sum(sum(p.numel() for p in m.parameters()) - m.active_parameters()
               for m in model.modules() if isinstance(m, FeedForward))


def _cmd_build(args) -> int:
    import torch

    from ..io.build import build
    from ..io.checkpoint import save

    if args.output:  # before any work: never replace a trained checkpoint with random weights unasked
        refuse_to_replace(args.output, force=args.force)
    torch.manual_seed(args.seed)
    model = build(args.recipe, args.overrides)
    total = _count(model)
    if args.output:
        save(model, args.output)
        print(f"built {model.recipe['model']['kind']} with {total:,} parameters -> {args.output}")
    else:
        print(f"built {model.recipe['model']['kind']} with {total:,} parameters (use -o FILE to save it)")
    return 0


def _cmd_generate(args) -> int:
    import torch

    from ..io.checkpoint import load
    from ..nn.generation import generate
    from ..nn.quantize import quantize, to_dtype
    from ..registry import tokenizer

    model = load(args.checkpoint, device=args.device)
    if args.dtype:
        to_dtype(model, args.dtype)
    if args.quantize:
        quantize(model, args.quantize)
    device = next(model.parameters()).device
    tok = tokenizer(model)
    if args.ids is not None:
        try:
            prompt = [int(x) for x in args.ids.split(",") if x.strip()]
        except ValueError:
            raise InputError(f"--ids: expected comma-separated integers, got {args.ids!r}") from None
    else:
        try:
            prompt = tok.encode(args.prompt)
        except InputError as error:  # e.g. a stored tokenizer.json that does not parse: name the file
            raise InputError(f"{args.checkpoint}: {error}") from None
        if not prompt:  # an empty prompt starts from the start token, as training prompts do
            start = tok.bos_id if tok.bos_id is not None else tok.eos_id
            if start is None:
                raise InputError("the prompt is empty and the tokenizer has no start (bos) token; give some text")
            prompt = [start]
    if not prompt:
        raise InputError("--ids is empty; give at least one token id")
    vocab = model.recipe["model"].get("vocab_size")
    bad = [i for i in prompt if i < 0 or (vocab is not None and i >= vocab)]
    if bad:
        raise InputError(f"--ids: token ids {bad[:5]} are outside the vocabulary [0, {vocab})")
    ids = torch.tensor([prompt], device=device)
    out = generate(model, ids, args.max_new_tokens, use_cache=not args.no_cache,
                          temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                          eos_id=tok.eos_id, seed=args.seed, beam_size=args.beam_size,
                          compile=args.compile)
    new = out[0, len(prompt):].tolist()
    if args.ids is not None:
        print(",".join(str(i) for i in out[0].tolist()))
    else:
        print(args.prompt + tok.decode(new))
    return 0


COMMANDS = {"list": _cmd_list, "plugins": _cmd_plugins, "check": _cmd_check, "show": _cmd_show,
            "build": _cmd_build, "generate": _cmd_generate}


def _load_plugins(refs: list[str]) -> None:
    """Load each ``--plugin``: one the user named and that does not load is an error (exit 2), as
    the command would otherwise run without what it was asked to use."""
    from ..registry import load_plugin

    for ref in refs:
        load_plugin(ref)


def _own_folders() -> tuple[str, ...]:
    """Where seqzoo's code and its built-in plugins live (one folder in a wheel, two in a checkout)."""
    spec = importlib.util.find_spec("seqzoo.plugins")
    plugins = list(spec.submodule_search_locations or []) if spec else []
    return tuple(os.path.abspath(p) + os.sep for p in [os.path.dirname(os.path.dirname(__file__)), *plugins])


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """seqzoo's own warnings as one line; another library's (torch's, at import) in its format."""
    if os.path.abspath(filename).startswith(_own_folders()):
        print(f"seqzoo: warning: {message}", file=sys.stderr)
    else:
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except KeyboardInterrupt:  # Ctrl-C while the command line is still starting up
        print("seqzoo: interrupted", file=sys.stderr)
        return 130
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _one_line_warning
            _load_plugins([*args.plugins, *(args.plugins_after or [])])
            return COMMANDS[args.command](args)
    except SeqzooError as error:
        if args.debug:
            raise
        for line in str(error).splitlines() or [""]:  # a recipe's several mistakes: a line each
            print(f"seqzoo: error: {line}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt as interrupt:
        # A training run says where its checkpoint is (TrainingInterrupted.message); anything else
        # stopped before it had done something worth a message.
        message = interrupt.message if isinstance(interrupt, TrainingInterrupted) else "interrupted"
        print(f"seqzoo: {message}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `seqzoo list | head`: the reader left; not an error
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
