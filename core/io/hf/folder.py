"""Reading a Hugging Face folder: its config.json and its safetensors weights (one file or shards),
lazily; pickles are refused."""
from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from pathlib import Path

from safetensors import SafetensorError, safe_open
from torch import Tensor

from ...errors import CheckpointError, few

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
TOKENIZER = "tokenizer.json"


def read_config(folder: Path) -> dict:
    """config.json of a Hugging Face folder, or a CheckpointError saying what is wrong."""
    if not folder.exists():
        raise CheckpointError(f"{folder}: no such folder")
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: not a folder; give the Hugging Face checkpoint folder "
                              f"(config.json + model.safetensors)")
    path = folder / CONFIG
    if not path.is_file():
        raise CheckpointError(f"{folder}: no {CONFIG}; a Hugging Face checkpoint folder has config.json "
                              f"and model.safetensors")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(config).__name__}")
    return config


class HFWeights(Mapping):
    """The tensors of a Hugging Face folder, read lazily from one or more safetensors files."""

    def __init__(self, folder: Path, stack: contextlib.ExitStack) -> None:
        self.folder = folder
        index, single = folder / INDEX, folder / WEIGHTS
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as error:
                raise CheckpointError(f"{index}: not a safetensors index ({type(error).__name__}: "
                                      f"{error})") from None
            files = sorted(set(weight_map.values()))
        elif single.is_file():
            files, weight_map = [WEIGHTS], None
        else:
            pickles = sorted(p.name for p in folder.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt"))
            if pickles:
                raise CheckpointError(
                    f"{folder}: has only {', '.join(pickles)} (pickle); seqzoo reads safetensors only. "
                    f"Convert it once with transformers: AutoModel.from_pretrained(folder)"
                    f".save_pretrained(new_folder) writes model.safetensors")
            raise CheckpointError(f"{folder}: no {WEIGHTS} or {INDEX}")
        self.handles = {}
        for name in files:
            path = folder / name
            if not path.is_file():
                raise CheckpointError(f"{folder}: shard {name} listed in {INDEX} is missing")
            try:
                self.handles[name] = stack.enter_context(safe_open(str(path), framework="pt", device="cpu"))
            except (SafetensorError, OSError, ValueError) as error:
                raise CheckpointError(f"{path}: not a readable safetensors file ({error})") from None
        self.where: dict[str, str] = {}
        for file, handle in self.handles.items():
            for key in handle.keys():
                self.where[key] = file
        if weight_map is not None:
            lost = sorted(k for k, f in weight_map.items() if self.where.get(k) != f)
            if lost:
                raise CheckpointError(f"{index}: tensors listed but not in their shard: {few(lost)}")

    def __getitem__(self, name: str) -> Tensor:
        return self.handles[self.where[name]].get_tensor(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.where)

    def __len__(self) -> int:
        return len(self.where)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.handles[self.where[name]].get_slice(name).get_shape())

    def dtype(self) -> str | None:
        """The dtype of the first floating-point tensor ("float32", "bfloat16", ...)."""
        for name in self.where:
            text = self.handles[self.where[name]].get_slice(name).get_dtype()
            found = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}.get(text)
            if found:
                return found
        return None
