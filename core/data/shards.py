"""Token shards: the on-disk form of a prepared corpus, and fixed-length windows read from it.

A prepared folder holds, per split (``train``, ``val``):

- ``SPLIT.bin``: every token of the split, documents one after the other, each followed by the
  tokenizer's end token — nanoGPT's flat file, read as a numpy memmap (uint16 when the vocabulary
  fits, else uint32; little-endian);
- ``SPLIT.idx``: the offset (uint64) of each document's first token, then the total, so document
  ``d`` is ``bin[idx[d]:idx[d + 1]]``;

and ``manifest.json``, written last: the format version, the tokenizer (its spec, identity hash,
vocabulary size and end id), the token dtype, each file's size and SHA-256, the counts, and the
sources with their hashes. A folder without a manifest was never finished and is never read.

A window is ``T + 1`` consecutive tokens (inputs and the next-token targets); window ``k`` of a
split starts at token ``k·T``, so windows tile the split without overlap. Which window a training
row reads is the sampler's business (``WindowSampler``): a fresh permutation of all windows per
epoch, seeded, so the stream is a pure function of (seed, sample index).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import SeqzooError

FORMAT = 1
MANIFEST = "manifest.json"
SPLITS = ("train", "val")
#: The token dtype of a vocabulary: the narrowest unsigned integer that holds every id.
DTYPES = {"uint16": np.uint16, "uint32": np.uint32}
HASH_CHUNK = 1 << 24  # 16 MiB: hashing reads in pieces, so a corpus larger than memory streams


class DataError(SeqzooError):
    """A prepared data folder that cannot be used: missing, unfinished, altered, or prepared with
    another tokenizer than the model's."""


def dtype_for(vocab_size: int) -> str:
    """``uint16`` when every id of a vocabulary of ``vocab_size`` fits in 16 bits, else ``uint32``."""
    if vocab_size <= 1 << 16:
        return "uint16"
    if vocab_size <= 1 << 32:
        return "uint32"
    raise DataError(f"a vocabulary of {vocab_size:,} ids does not fit in uint32 token shards")


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file, read in 16 MiB pieces."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class Split:
    """One split of a prepared folder: ``tokens`` (N,) and document ``starts`` (D + 1,) memmaps."""

    name: str
    tokens: np.ndarray
    starts: np.ndarray

    @property
    def documents(self) -> int:
        return len(self.starts) - 1

    def window_count(self, seq_len: int) -> int:
        """How many non-overlapping windows of ``seq_len`` inputs (+ 1 target) the split holds."""
        return max(0, (len(self.tokens) - 1) // seq_len)

    def windows(self, indices: np.ndarray, seq_len: int) -> np.ndarray:
        """Windows ``indices`` (B,) -> int64 tokens (B, T + 1): window k is tokens[k·T : k·T + T + 1]."""
        offsets = indices.astype(np.int64)[:, None] * seq_len + np.arange(seq_len + 1)  # (B, T + 1)
        return self.tokens[offsets].astype(np.int64)

    def document_ids(self, indices: np.ndarray, seq_len: int) -> np.ndarray:
        """The document of each input token of windows ``indices`` (B,) -> (B, T), numbered from 0
        within each row (so equal ids mean the same document only within a row)."""
        offsets = indices.astype(np.int64)[:, None] * seq_len + np.arange(seq_len)  # (B, T)
        documents = np.searchsorted(self.starts, offsets, side="right") - 1
        return documents - documents[:, :1]


@dataclass(frozen=True)
class TokenShards:
    """A prepared folder, opened: its ``manifest`` and the memmapped ``train``/``val`` splits."""

    folder: Path
    manifest: dict
    train: Split
    val: Split

    @property
    def vocab_size(self) -> int:
        return int(self.manifest["tokenizer"]["vocab_size"])

    @property
    def eos_id(self) -> int:
        return int(self.manifest["tokenizer"]["eos_id"])

    @property
    def tokenizer_identity(self) -> str:
        return self.manifest["tokenizer"]["identity"]

    @property
    def fingerprint(self) -> str:
        """What identifies the prepared data: the hash of its inputs, tokenizer and settings."""
        return self.manifest["fingerprint"]

    def split(self, name: str) -> Split:
        return self.train if name == "train" else self.val


def read_manifest(folder: str | Path) -> dict:
    """The manifest of a prepared folder, or a DataError saying why there is none."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise DataError(f"{folder}: no such data folder; prepare one with `seqzoo data prepare SRC... -o {folder}`")
    path = folder / MANIFEST
    if not path.is_file():
        raise DataError(f"{folder}: no {MANIFEST}, so it is not a finished prepared folder (an interrupted "
                        f"`seqzoo data prepare` leaves none); run `seqzoo data prepare SRC... -o {folder}` again")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise DataError(f"{path}: unreadable manifest ({error}); prepare the folder again") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        raise DataError(f"{path}: data format {found!r}, this seqzoo reads format {FORMAT}; prepare the folder "
                        f"again with this version")
    return manifest


def open_shards(folder: str | Path, *, verify: bool = True) -> TokenShards:
    """Open a prepared folder. Every file's size is checked against the manifest; with ``verify``
    its SHA-256 too, so a truncated or edited shard is refused before a step trains on it."""
    folder = Path(folder).expanduser()
    manifest = read_manifest(folder)
    dtype = manifest["dtype"]
    if dtype not in DTYPES:
        raise DataError(f"{folder / MANIFEST}: unknown token dtype {dtype!r} (expected one of {', '.join(DTYPES)})")
    splits = {}
    for name in SPLITS:
        record = manifest["splits"][name]
        for suffix, key in (("bin", "tokens_file"), ("idx", "index_file")):
            path = folder / f"{name}.{suffix}"
            expected = record[key]
            if not path.is_file():
                raise DataError(f"{path}: missing from the prepared folder; prepare it again")
            size = path.stat().st_size
            if size != expected["bytes"]:
                raise DataError(f"{path}: {size:,} bytes where the manifest says {expected['bytes']:,} (truncated "
                                f"or changed after prepare); prepare the folder again")
            if verify and file_sha256(path) != expected["sha256"]:
                raise DataError(f"{path}: its SHA-256 does not match the manifest (the file was changed after "
                                f"prepare); prepare the folder again")
        tokens = _memmap(folder / f"{name}.bin", DTYPES[dtype])
        starts = _memmap(folder / f"{name}.idx", np.uint64)
        splits[name] = Split(name, tokens, starts)
    return TokenShards(folder, manifest, splits["train"], splits["val"])


def _memmap(path: Path, dtype) -> np.ndarray:
    """A read-only memmap of a flat little-endian file (an empty array for an empty file, which
    numpy cannot map)."""
    if path.stat().st_size == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=np.dtype(dtype).newbyteorder("<"), mode="r")


class WindowSampler:
    """Which window each training sample reads: sample ``i`` (counted over the whole run, all
    ranks and micro-batches) is window ``perm_e[i mod n]`` of epoch ``e = i // n``, where each
    epoch's permutation of the ``n`` windows is drawn from (seed, e). The position in the stream
    is therefore one integer — the samples consumed — which the checkpoint keeps."""

    def __init__(self, windows: int, seed: int) -> None:
        if windows < 1:
            raise DataError("the split holds no window of the requested length")
        self.windows, self.seed = windows, seed
        self._epoch, self._perm = -1, np.empty(0, dtype=np.int64)

    def permutation(self, epoch: int) -> np.ndarray:
        if epoch != self._epoch:
            rng = np.random.Generator(np.random.PCG64([self.seed, epoch]))
            self._epoch, self._perm = epoch, rng.permutation(self.windows)
        return self._perm

    def indices(self, start: int, count: int) -> np.ndarray:
        """The windows of samples ``start .. start + count − 1`` (count,)."""
        out = np.empty(count, dtype=np.int64)
        position = 0
        while position < count:
            epoch, offset = divmod(start + position, self.windows)
            take = min(count - position, self.windows - offset)
            out[position:position + take] = self.permutation(epoch)[offset:offset + take]
            position += take
        return out


def evaluation_windows(windows: int, count: int) -> np.ndarray:
    """A fixed set of held-out windows: ``count`` of the ``windows``, evenly spaced (all of them
    when there are fewer)."""
    if count >= windows:
        return np.arange(windows, dtype=np.int64)
    return (np.arange(count, dtype=np.int64) * windows) // count
