"""``seqzoo describe FILE`` (what a checkpoint holds: its model, tokenizer, and whether it is a
resumable training checkpoint or weights alone) and ``seqzoo export FILE -o OUT`` (the weights
alone, for sharing: a training checkpoint carries AdamW's two moments, about 3× the weights)."""
from __future__ import annotations

import json
import os

from ..errors import InputError
from ..files import refuse_folder


def register_cli(add) -> dict:
    p = add("describe", help="what a checkpoint holds: model, parameters, tokenizer, training state or weights only")
    p.add_argument("checkpoint", help="a .safetensors file written by seqzoo")
    p = add("export", help="write a checkpoint's weights alone (no optimizer state): for sharing, not resuming")
    p.add_argument("checkpoint", help="a .safetensors file written by seqzoo (a training checkpoint)")
    p.add_argument("-o", "--output", required=True, help="the weights-only .safetensors file to write")
    return {"describe": _cmd_describe, "export": _cmd_export}


def checkpoint_summary(path: str) -> dict:
    """What ``describe`` prints, as data: the model kind and recipe, the weight and training-state
    sizes (counted from the file's header, nothing loaded), the tokenizer, and the run's progress."""
    from safetensors import safe_open

    from ..io.checkpoint import EXTRA_PREFIX, read_metadata, read_recipe

    metadata = read_metadata(path)
    recipe = read_recipe(path, metadata)
    weights = state = 0
    parameters = 0
    with safe_open(path, framework="pt", device="cpu") as handle:
        for name in handle.keys():
            tensor = handle.get_slice(name)
            shape = tensor.get_shape()
            count = 1
            for size in shape:
                count *= size
            nbytes = count * _itemsize(tensor.get_dtype())
            if name.startswith(EXTRA_PREFIX):
                state += nbytes
            else:
                weights += nbytes
                parameters += count
    tokenizer = recipe.get("tokenizer", "bytes")
    summary = {"file": path, "bytes": os.path.getsize(path), "model": recipe["model"]["kind"],
               "parameters": parameters, "weight_bytes": weights, "state_bytes": state,
               "tokenizer": tokenizer if isinstance(tokenizer, str) else tokenizer.get("kind"),
               "training": None}
    if "seqzoo.train" in metadata:
        train = json.loads(metadata["seqzoo.train"])
        last = (train.get("history") or [{}])[-1]
        summary["training"] = {"step": train["step"], "steps": train.get("config", {}).get("steps"),
                               "loss": last.get("loss"), "eval": last.get("eval"),
                               "task": train.get("config", {}).get("task")}
    return summary


def _itemsize(dtype: str) -> int:
    return {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2,
            "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}.get(dtype, 4)


def _cmd_describe(args) -> int:
    s = checkpoint_summary(args.checkpoint)
    print(f"{s['file']}: {s['model']}, {s['parameters']:,} parameters ({s['weight_bytes'] / 2**20:.1f} MiB), "
          f"tokenizer {s['tokenizer']}; file {s['bytes'] / 2**20:.1f} MiB")
    if s["training"] is None:
        print("weights only: loads, generates and exports; a training run cannot resume from it (--init can start one)")
        return 0
    t = s["training"]
    task = t["task"]["kind"] if isinstance(t["task"], dict) else t["task"]
    progress = f"step {t['step']:,}" + (f" of {t['steps']:,}" if t["steps"] else "")
    print(f"training checkpoint: {progress} on task {task}, with optimizer and random state "
          f"({s['state_bytes'] / 2**20:.1f} MiB, {s['state_bytes'] / max(s['weight_bytes'], 1):.1f}× the weights): "
          f"resumable with --resume; `seqzoo export {args.checkpoint} -o FILE` writes the weights alone")
    if t["loss"] is not None:
        line = f"last logged loss {t['loss']:.4f}"
        if t["eval"]:
            line += f", held-out loss {t['eval']['loss']:.4f}"
        print(line)
    return 0


def _cmd_export(args) -> int:
    from ..io.checkpoint import load, save

    if os.path.abspath(args.output) == os.path.abspath(args.checkpoint):
        raise InputError(f"-o {args.output}: give another file than the checkpoint itself")
    model = load(args.checkpoint, device="cpu")
    save(model, args.output)
    before, after = os.path.getsize(args.checkpoint), os.path.getsize(args.output)
    print(f"wrote {args.output}: weights only, {after / 2**20:.1f} MiB (from {before / 2**20:.1f} MiB)")
    return 0



def refuse_to_replace(path: str, *, force: bool, option: str = "-o", resumable: bool = False) -> None:
    """Refuse to write over an existing file at ``path`` unless ``force``: the refusal says what the
    file holds (the model, and for a training checkpoint how far its run got) and the ways out.
    ``resumable``: the command can continue the run saved there instead (``train --resume``)."""
    refuse_folder(path, "model.safetensors", option)  # --force cannot replace a folder with a file
    if force or not os.path.exists(path):
        return
    from ..errors import SeqzooError

    try:
        s = checkpoint_summary(path)
    except SeqzooError:
        s = None
    ways = f"add --force to replace it, or write elsewhere with {option} OTHER"
    if s is None:
        held = "a file that is not a seqzoo checkpoint"
    elif s["training"] is None:
        held = f"a {s['model']} with {s['parameters']:,} parameters (weights only)"
    else:
        t = s["training"]
        task = t["task"]["kind"] if isinstance(t["task"], dict) else t["task"]
        of = f" of {t['steps']:,}" if t["steps"] else ""
        held = f"a {s['model']} with {s['parameters']:,} parameters, trained {t['step']:,}{of} steps on {task}"
        if resumable:
            ways = f"continue that run with --resume {path}, or " + ways
    raise InputError(f"{option} {path}: the file already holds {held}; {ways}")
