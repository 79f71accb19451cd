"""safetensors files written and read one tensor at a time, with a checksum per tensor.

The format is the safetensors one (an 8-byte little-endian header length, a JSON header with each
tensor's dtype, shape and byte range and a ``__metadata__`` map of strings, then the tensors'
bytes), and the files are read by ``safetensors.safe_open`` like any other; ``safetensors``'
own reader and writer are used everywhere a whole file fits in memory twice.

Two things here that the library does not do, which is why this module exists:

- **Memory.** ``safetensors.torch.save_file`` turns every tensor into a bytes object before it
  writes (twice the model's size at the peak), and loading through ``safe_open`` copies each
  tensor out of a memory map the process keeps resident. Here each tensor's bytes go from its own
  storage to the file and back (``readinto`` the parameter itself), so saving or loading a model
  costs no memory beyond the model: a 7B model in bfloat16 (13.5 GB) saves and loads on a
  24 GB machine.
- **Integrity.** safetensors carries no checksum: a flipped byte in the data area loads silently.
  ``write`` records an xxh3-64 digest of each tensor's bytes in the metadata (``CHECKSUMS``);
  ``read_into`` checks each tensor against it as it arrives and names the first damaged one.
  Files without the key (other tools, older seqzoo) load unchecked.
"""
from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO

import torch
import xxhash
from torch import Tensor

#: The metadata key holding {tensor name: xxh3-64 hex digest of its bytes}.
CHECKSUMS = "seqzoo.checksums"

DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
    "U64": torch.uint64, "U32": torch.uint32, "U16": torch.uint16, "C64": torch.complex64,
}
NAMES = {dtype: name for name, dtype in DTYPES.items()}
#: The header's JSON is padded with spaces to a multiple of this (safetensors' alignment).
ALIGN = 8
#: The most header bytes a file may declare (safetensors' own limit): a damaged length field
#: must not make the reader allocate gigabytes.
MAX_HEADER = 100_000_000


class DamagedFile(ValueError):
    """The file is not a well-formed safetensors file, or a tensor's bytes differ from its checksum."""


def _bytes(tensor: Tensor):
    """The bytes of a CPU tensor as a buffer, without a copy (contiguous tensors only)."""
    return tensor.reshape(-1).view(torch.uint8).numpy().data if tensor.numel() else b""


def digest(tensor: Tensor) -> str:
    """The xxh3-64 hex digest of a CPU tensor's bytes, as ``write`` records it."""
    return xxhash.xxh3_64_hexdigest(_bytes(tensor.contiguous()))


def write(path: str | os.PathLike, tensors: dict[str, Tensor], metadata: dict[str, str]) -> None:
    """Write ``tensors`` (any device; moved to the CPU one at a time) and ``metadata`` to ``path``
    as a safetensors file, with ``CHECKSUMS`` added to the metadata."""
    cpu = {name: tensor.detach() for name, tensor in tensors.items()}
    checksums, header, offset = {}, {}, 0
    for name, tensor in cpu.items():
        if tensor.dtype not in NAMES:
            raise TypeError(f"{name}: dtype {tensor.dtype} has no safetensors name")
        size = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": NAMES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
        checksums[name] = digest(_on_cpu(tensor))
    text = json.dumps({"__metadata__": {**metadata, CHECKSUMS: json.dumps(checksums, sort_keys=True)}, **header},
                      separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % ALIGN)
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(text)))
        handle.write(text)
        for tensor in cpu.values():
            handle.write(_bytes(_on_cpu(tensor)))


def _on_cpu(tensor: Tensor) -> Tensor:
    return tensor.to("cpu").contiguous()


class Reader:
    """A safetensors file's header, and its tensors read one at a time (``read_into``)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        with open(self.path, "rb") as handle:
            self.header, self.start = _header(handle, os.fstat(handle.fileno()).st_size)
        self.metadata: dict[str, str] = self.header.pop("__metadata__", None) or {}
        try:
            self.checksums: dict[str, str] = json.loads(self.metadata.get(CHECKSUMS, "{}"))
        except json.JSONDecodeError:
            raise DamagedFile(f"its {CHECKSUMS} metadata is not JSON") from None

    def names(self) -> list[str]:
        return list(self.header)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.header[name]["shape"])

    def dtype(self, name: str) -> torch.dtype:
        return DTYPES[self.header[name]["dtype"]]

    def read_into(self, targets: Iterable[tuple[str, Tensor]], *,
                  on_tensor: Callable[[str, Tensor], None] | None = None) -> None:
        """Read each stored tensor ``name`` into ``target`` (same shape; any dtype and device: a
        CPU target of the stored dtype is filled in place, anything else through one temporary
        tensor), checking its checksum when the file has one. ``on_tensor(name, stored)`` sees
        each tensor as stored (before any cast)."""
        with open(self.path, "rb", buffering=0) as handle:
            for name, target in targets:
                entry = self.header[name]
                begin, end = entry["data_offsets"]
                direct = (target.device.type == "cpu" and target.dtype == self.dtype(name)
                          and target.is_contiguous())
                buffer = target if direct else torch.empty(self.shape(name), dtype=self.dtype(name))
                view = _bytes(buffer)
                handle.seek(self.start + begin)
                if len(view) != end - begin or (len(view) and handle.readinto(view) != end - begin):
                    raise DamagedFile(f"tensor {name}: the file ends inside its bytes")
                expected = self.checksums.get(name)
                if expected is not None and xxhash.xxh3_64_hexdigest(view) != expected:
                    raise DamagedFile(f"tensor {name}: its bytes differ from the checksum saved with it "
                                      f"(the file was damaged after it was written)")
                if on_tensor is not None:
                    on_tensor(name, buffer)
                if not direct:
                    target.copy_(buffer)


def _header(handle: BinaryIO, size: int) -> tuple[dict, int]:
    """The parsed JSON header and where the data area starts; DamagedFile when either is wrong."""
    head = handle.read(8)
    if len(head) < 8:
        raise DamagedFile("shorter than a safetensors header")
    (length,) = struct.unpack("<Q", head)
    if length > min(MAX_HEADER, size - 8):
        raise DamagedFile(f"its header claims {length:,} bytes, past the end of the file")
    try:
        header = json.loads(handle.read(length))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise DamagedFile("its header is not JSON") from None
    if not isinstance(header, dict):
        raise DamagedFile("its header is not a mapping")
    data = size - 8 - length
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = entry["data_offsets"]
            count = 1
            for dim in entry["shape"]:
                count *= dim
            width = torch.empty((), dtype=DTYPES[entry["dtype"]]).element_size()
        except (KeyError, TypeError, ValueError):
            raise DamagedFile(f"tensor {name}: its header entry is malformed") from None
        if not 0 <= begin <= end <= data or end - begin != count * width:
            raise DamagedFile(f"tensor {name}: its byte range {begin}..{end} does not fit its shape and the file")
    return header, 8 + length
