"""A GGUF file read through the gguf package: its metadata, and its tensors dequantised to float32
in torch's dimension order (GGUF lists dimensions innermost first)."""
from __future__ import annotations

import os
from pathlib import Path

import torch

from ...errors import CheckpointError

INSTALL = "pip install 'seqzoo[gguf]' (the gguf package)"


def gguf_package():
    try:
        import gguf
    except ImportError:
        raise CheckpointError(f"GGUF files need the gguf package: {INSTALL}") from None
    return gguf


class GGUFFile:
    """``meta``: {key: value}; ``tensors``: {GGUF name: the reader's tensor}; ``tensor(name)``:
    float32, dequantised."""

    def __init__(self, path: str | os.PathLike) -> None:
        gguf = gguf_package()
        self.path = Path(path)
        if not self.path.is_file():
            raise CheckpointError(f"{self.path}: no such file")
        try:
            self.reader = gguf.GGUFReader(str(self.path))
        except Exception as error:  # the reader raises ValueError / struct.error on a bad file
            raise CheckpointError(f"{self.path}: not a readable GGUF file ({type(error).__name__}: {error})") from None
        self.meta = {name: field.contents() for name, field in self.reader.fields.items()}
        self.architecture = self.meta.get("general.architecture")
        self.tensors = {t.name: t for t in self.reader.tensors}
        unknown = sorted({t.tensor_type.name for t in self.reader.tensors} - self.dequantisable())
        if unknown:
            raise CheckpointError(f"{self.path}: tensor types {', '.join(unknown)} cannot be dequantised by the gguf "
                                  f"package installed; supported: {', '.join(sorted(self.dequantisable()))}")

    @staticmethod
    def dequantisable() -> set[str]:
        """The tensor types the installed gguf package can turn into float32."""
        gguf = gguf_package()
        plain = {"F32", "F16", "BF16", "F64"}  # the package has a dequantiser class per quantised type
        return plain | {t.name for t in gguf.GGMLQuantizationType
                        if isinstance(getattr(gguf.quants, t.name, None), type)}

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(int(d) for d in reversed(self.tensors[name].shape.tolist()))

    def tensor(self, name: str) -> torch.Tensor:
        gguf = gguf_package()
        t = self.tensors[name]
        array = gguf.quants.dequantize(t.data, t.tensor_type)
        return torch.from_numpy(array.astype("float32", copy=True).reshape(self.shape(name)))

    def types(self) -> dict[str, int]:
        """How many tensors of each type the file holds."""
        out: dict[str, int] = {}
        for t in self.tensors.values():
            out[t.tensor_type.name] = out.get(t.tensor_type.name, 0) + 1
        return out

    def get(self, key: str, default=None):
        """Metadata ``{architecture}.{key}``."""
        return self.meta.get(f"{self.architecture}.{key}", default)
