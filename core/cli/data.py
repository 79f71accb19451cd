"""``seqzoo data prepare`` (a corpus to token shards) and ``seqzoo data tokenizer`` (a byte-level BPE
trained on a corpus), see ``seqzoo.data``."""
from __future__ import annotations

import json
import shlex
import sys

from ..errors import InputError
from ..train.progress import progress

SOURCES_HELP = (".txt (or any text) files and folders of them, .jsonl/.json/.parquet files (one document per "
                "record), folders written by datasets' save_to_disk")


def register_cli(add) -> dict:
    p = add("data", help="prepare corpora as token shards; train a BPE tokenizer on a corpus")
    commands = p.add_subparsers(dest="data_command", metavar="COMMAND", required=True)

    q = commands.add_parser("prepare", help="tokenize a corpus into token shards (train/val) with a manifest")
    q.add_argument("sources", nargs="+", metavar="SRC", help=SOURCES_HELP)
    q.add_argument("-o", "--output", required=True, metavar="DIR", help="the folder to write the shards into")
    q.add_argument("--tokenizer", default="bytes", metavar="T",
                   help="bytes (default), a tokenizer.json, or a seqzoo checkpoint (its tokenizer)")
    _split_options(q)
    q.add_argument("--dtype", default="auto", choices=["auto", "uint16", "uint32"],
                   help="token dtype (auto: uint16 when the vocabulary fits)")
    q.add_argument("--workers", type=int, metavar="N",
                   help="tokenizer processes (default: up to 4 of the cores; 0 = this process)")
    q.add_argument("--quiet", action="store_true", help="no progress bar")

    t = commands.add_parser("tokenizer", help="train a byte-level BPE tokenizer on a corpus's training split")
    t.add_argument("sources", nargs="+", metavar="SRC", help=SOURCES_HELP)
    t.add_argument("-o", "--output", required=True, metavar="FILE", help="the tokenizer.json to write")
    t.add_argument("--vocab", type=int, required=True, metavar="N", help="vocabulary size (ids, with the end token)")
    _split_options(t)
    t.add_argument("--min-frequency", type=int, default=2, metavar="K", help="merge pairs seen at least K times (2)")
    return {"data": _cmd_data}


def _split_options(p) -> None:
    p.add_argument("--val", type=float, default=0.1, metavar="FRACTION",
                   help="held-out fraction: of the documents, or of the tokens for a one-document corpus (0.1)")
    p.add_argument("--field", default="text", help="the record field that holds the text (text)")
    p.add_argument("--glob", metavar="PATTERN", help="in folders, only files matching this (e.g. '*.py')")
    p.add_argument("--exclude", action="append", default=[], metavar="PATTERN",
                   help="in folders, skip files and folders matching this (e.g. 'site-packages'); repeatable")


def _warn(message: str) -> None:
    print(f"seqzoo: warning: {message}", file=sys.stderr)


def _cmd_data(args) -> int:
    if args.data_command == "tokenizer":
        return _cmd_tokenizer(args)
    if args.workers is not None and args.workers < 0:
        raise InputError(f"--workers must be >= 0, got {args.workers}")
    # Imported here: the data layer needs numpy, which `seqzoo --help` and the other commands do not.
    from ..data.prepare import prepare
    from ..data.shards import open_shards
    from ..data.tokenizer import resolve_tokenizer
    info = resolve_tokenizer(args.tokenizer)
    done = prepare(args.sources, args.output, info, val=args.val, field=args.field, glob=args.glob,
                   exclude=tuple(args.exclude), dtype=args.dtype, workers=args.workers, log=_warn,
                   progress=None if args.quiet else lambda **kw: progress(show=True, every=64 << 20, **kw))
    manifest = done.manifest
    splits = manifest["splits"]
    counts = ", ".join(f"{name} {s['tokens']:,} tokens in {s['documents']:,} document(s)" for name, s in splits.items())
    if done.up_to_date:
        open_shards(done.folder, verify=False)  # the files are still there, at their sizes
        print(f"{done.folder}: up to date (same sources, tokenizer and settings); nothing to do ({counts})")
        return 0
    read = sum(s["text_bytes"] for s in splits.values())
    rate = read / 1e6 / max(done.seconds, 1e-9)
    print(f"{done.folder}: {counts}; {manifest['dtype']}, split by {manifest['split']}; "
          f"{read / 1e6:.1f} MB of text in {done.seconds:.1f} s ({rate:.1f} MB/s)")
    spec = manifest["tokenizer"]["spec"]
    if spec["kind"] == "hf":
        spec = {**spec, "path": str(done.folder / "tokenizer.json")}
    print(f"train on it: seqzoo train RECIPE --data {shlex.quote(str(done.folder))}"
          + ("" if spec["kind"] == "bytes" else
             f" --set {shlex.quote('tokenizer=' + json.dumps(spec))} "
             f"--set model.vocab_size={manifest['tokenizer']['vocab_size']}"))
    return 0


def _cmd_tokenizer(args) -> int:
    if args.min_frequency < 1:
        raise InputError(f"--min-frequency must be >= 1, got {args.min_frequency}")
    from ..data.tokenizer import train_bpe
    spec = train_bpe(args.sources, args.output, args.vocab, val=args.val, field=args.field, glob=args.glob,
                     exclude=tuple(args.exclude), min_frequency=args.min_frequency, log=_warn)
    vocab = spec.pop("vocab_size")
    print(f"wrote {spec['path']}: byte-level BPE, {vocab:,} ids, end token <|endoftext|> = {spec['eos_id']}")
    selection = [*(["--glob", args.glob] if args.glob else []),
                 *(item for pattern in args.exclude for item in ("--exclude", pattern)), "--val", str(args.val)]
    print(f"prepare with it: seqzoo data prepare {' '.join(shlex.quote(s) for s in args.sources)} "
          f"{' '.join(shlex.quote(s) for s in selection)} -o DIR --tokenizer {shlex.quote(spec['path'])}")
    print(f"a recipe uses it with: tokenizer: {json.dumps(spec)}, model.vocab_size: {vocab}")
    return 0
