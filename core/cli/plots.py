"""``seqzoo plot``, ``attention``, ``positions`` and ``experiment``: pictures of training runs,
attention maps and position schemes, and the experiments of docs/experiments.md (see
``seqzoo.lab.plots`` and ``seqzoo.lab.experiments``). matplotlib (``pip install 'seqzoo[plot]'``) is
imported only when one of these commands draws."""
from __future__ import annotations

import os
import sys

from ..errors import InputError
from ..files import refuse_folder
from .options import add_set, at_least


def register_cli(add) -> dict:
    """Add the picture and experiment commands; ``add(name, help=...)`` makes a subparser."""
    p = add("plot", help="plot loss, held-out accuracy and learning rate from a --metrics JSON")
    p.add_argument("metrics", help="the JSON file `seqzoo train --metrics` wrote")
    p.add_argument("-o", "--output", help="PNG to write (default: METRICS with .png)")
    p.add_argument("--title", help="figure title (default: the file name)")

    p = add("attention", help="per-layer, per-head attention maps of a checkpoint on a prompt")
    p.add_argument("checkpoint", help="a .safetensors file written by seqzoo")
    p.add_argument("--prompt", required=True, help="text, encoded with the recipe's tokenizer")
    p.add_argument("-o", "--output", default="attention.png", help="PNG to write (attention.png)")
    p.add_argument("--max-new-tokens", type=int, default=32,
                   help="greedy continuation included in the maps (32; 0 = the prompt only)")

    p = add("positions", help="what a recipe's position scheme does (RoPE wavelengths, bias per distance, tables)")
    p.add_argument("recipe", help="recipe path or shipped name, or a checkpoint (trained tables)")
    p.add_argument("-o", "--output", default="positions.png", help="PNG to write (positions.png)")
    add_set(p)
    p.add_argument("--length", type=int, help="positions / distances to show (default from the recipe)")

    p = add("experiment", help="run experiments: extrapolation, seq2seq-attention, vanishing-gradients, "
                           "linear-time, recall, copying, delta-rule, moe, surgery")
    p.add_argument("names", nargs="+", metavar="name",
                   help="extrapolation | seq2seq-attention | vanishing-gradients | linear-time | recall | copying | "
                        "delta-rule | moe | surgery; several run one after another")
    p.add_argument("-o", "--output", metavar="DIR", help="folder for NAME.md, NAME.json, NAME.png (default "
                                                         "experiments/NAME); with several names, DIR/NAME for each")
    p.add_argument("--quick", action="store_true", help="a tiny version that runs in seconds")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (1)")
    p.add_argument("--workers", type=int, help="runs trained at once by recall, copying, delta-rule and moe "
                                               "(default: cores / threads)")
    p.add_argument("--report-only", action="store_true",
                   help="recall, copying, delta-rule, moe: train nothing; rebuild the table and figure from the "
                        "finished runs in the output folder")
    return {"plot": _cmd_plot, "attention": _cmd_attention, "positions": _cmd_positions,
            "experiment": _cmd_experiment}


def _cmd_plot(args) -> int:
    from ..lab.plots import load_metrics, plot_metrics

    output = args.output or os.path.splitext(args.metrics)[0] + ".png"
    refuse_folder(output, os.path.basename(os.path.splitext(args.metrics)[0]) + ".png", "-o")
    metrics = load_metrics(args.metrics)
    title = args.title if args.title is not None else os.path.basename(args.metrics)
    print(f"wrote {plot_metrics(metrics, output, title)}")
    return 0


def _cmd_attention(args) -> int:
    from ..io.checkpoint import load
    from ..lab.plots import attention_panels, plot_attention, require_matplotlib
    from ..registry import tokenizer

    if args.max_new_tokens < 0:
        raise InputError(f"--max-new-tokens must be >= 0, got {args.max_new_tokens}")
    refuse_folder(args.output, "attention.png", "-o")
    require_matplotlib()  # reported before the model loads
    model = load(args.checkpoint, device="cpu")
    panels = attention_panels(model, tokenizer(model), args.prompt, args.max_new_tokens)
    kind = model.recipe["model"]["kind"]
    path = plot_attention(panels, args.output, f"{os.path.basename(args.checkpoint)} ({kind}): {args.prompt!r}")
    print(f"wrote {path} ({len(panels)} attention module{'s' if len(panels) != 1 else ''})")
    return 0


def _cmd_positions(args) -> int:
    from ..lab.plots import require_matplotlib
    from ..lab.positions import PositionPicture, describe_position, plot_positions, position_schemes

    if args.length is not None and args.length < 2:
        raise InputError(f"--length must be >= 2, got {args.length}")
    refuse_folder(args.output, "positions.png", "-o")
    require_matplotlib()
    schemes, note = position_schemes(args.recipe, args.overrides)
    if not schemes:
        pictures = [PositionPicture("nothing", args.recipe, note="this model has no position scheme "
                                    "(recurrent models know order from the recurrence): nothing to plot")]
    else:
        pictures = []
        for name, scheme in schemes:
            pictures.append(describe_position(scheme, name, args.length))
    path = plot_positions(pictures, args.output, os.path.basename(args.recipe), note)
    for picture in pictures:
        if picture.kind == "nothing":
            print(f"note: {picture.name}: {picture.note}", file=sys.stderr)
    print(f"wrote {path}")
    return 0


def _cmd_experiment(args) -> int:
    from ..lab.experiments import check_names, run_experiment

    at_least(1, ("--workers", args.workers))  # 0 would otherwise mean "the default", as compare refuses
    check_names(args.names, args.report_only)  # every name before the first runs
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    for name in args.names:
        # several: each in a folder of its own under -o, where delta-rule finds recall/ and copying/ beside it
        output = os.path.join(args.output, name) if args.output and len(args.names) > 1 else args.output
        result, paths = run_experiment(name, output, quick=args.quick, threads=args.threads, log=log,
                                       workers=args.workers, report_only=args.report_only)
        print(f"{result.title}\n\n{result.markdown()}\n\n{result.seconds} s; wrote "
              f"{paths['md']}, {paths['json']}, {paths['png']}")
    return 0
