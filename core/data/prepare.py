"""``seqzoo data prepare``: a corpus becomes token shards (``seqzoo.data.shards``), once.

The corpus is streamed: documents are read in pieces (``seqzoo.data.sources``), tokenized in
worker processes a few pieces at a time, and appended to the split they belong to; nothing holds
the corpus in memory. The output is deterministic — the same inputs, tokenizer and settings give
the same bytes, whatever the number of workers — and is written under temporary names; the
manifest comes last, so a prepare killed midway leaves no manifest and nothing that reads as
finished. Re-running with the same inputs finds the manifest's fingerprint equal and does nothing.

Split: with several documents, a ``val`` fraction of them (at least one) is held out, spread
evenly through the corpus (document ``i`` of ``D`` is held out when ``⌊(i+1)·n/D⌋ > ⌊i·n/D⌋``
for ``n`` held-out documents); a corpus of one document is split by position instead, its last
``val`` fraction of tokens held out, as nanoGPT does.
"""
from __future__ import annotations

import collections
import hashlib
import json
import multiprocessing
import os
import shutil
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..files import file_in_the_way, write_text_atomic
from ..interfaces import Tokenizer
from .shards import DTYPES, FORMAT, MANIFEST, SPLITS, DataError, dtype_for, file_sha256, read_manifest
from .sources import PIECE, Source, count_documents, documents, find_sources, skipped

#: Below this much input, tokenizing in this process beats starting workers.
INLINE_BYTES = 8 << 20


@dataclass(frozen=True)
class TokenizerInfo:
    """The tokenizer prepare encodes with: the object, its recipe ``spec`` (what a model's
    ``tokenizer:`` must say), and the tokenizer.json text to copy beside the shards (or None)."""

    tokenizer: Tokenizer
    spec: dict
    file_text: str | None = None


@dataclass
class Prepared:
    """What ``prepare`` did: the manifest, and whether the folder was already up to date."""

    folder: Path
    manifest: dict
    up_to_date: bool
    seconds: float = 0.0


def held_out(index: int, documents: int, held: int) -> bool:
    """Whether document ``index`` of ``documents`` is one of the ``held`` held-out ones (evenly spread)."""
    return (index + 1) * held // documents > index * held // documents


def held_out_count(documents: int, val: float) -> int:
    """Held-out documents for a fraction ``val``: at least one (when val > 0), at most D − 1."""
    if val <= 0 or documents < 2:
        return 0
    return min(documents - 1, max(1, round(documents * val)))


def fingerprint(sources: list[Source], hashes: list[str], tokenizer: TokenizerInfo, settings: dict) -> str:
    """The hash of everything the output depends on: the format, the tokenizer's identity and end
    id, the settings, and every source's name and content hash."""
    record = {"format": FORMAT, "tokenizer": tokenizer.tokenizer.identity(), "eos": tokenizer.tokenizer.eos_id,
              "settings": settings, "sources": [[s.name, h] for s, h in zip(sources, hashes)]}
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


def _check_output(folder: Path, output: str, arguments: list[str], exclude: tuple[str, ...]) -> None:
    """Refuse an output folder that cannot be made (a file is in its place) or that lies in a source
    folder, unless the walk skips it (hidden, or --exclude): the next run would read the shards back
    as input, and the source's files would change under it."""
    file = file_in_the_way(folder)
    if file is not None:
        raise DataError(f"-o {output}: {file} is a file, not a folder; give a folder for the shards (created "
                        f"if missing) such as {file}-shards")
    target = folder.resolve()
    for argument in arguments:
        source = Path(argument).expanduser().resolve()
        if not source.is_dir() or not target.is_relative_to(source):
            continue
        parts = target.relative_to(source).parts
        if any(skipped(part, "/".join(parts[:i + 1]), exclude) for i, part in enumerate(parts)):
            continue  # the walk never enters it
        inside = "is the source folder itself" if not parts else f"is inside the source folder {argument}"
        beside = os.path.relpath(source.parent / f"{source.name}-shards")
        hint = f", or add --exclude {'/'.join(parts)}" if parts else ""
        raise DataError(f"-o {output}: {inside}, so the next run would read the shards back as input; write "
                        f"them outside it (e.g. -o {beside}){hint}")


def prepare(arguments: list[str], output: str | Path, tokenizer: TokenizerInfo, *, val: float = 0.1,
            field: str = "text", glob: str | None = None, exclude: tuple[str, ...] = (), dtype: str = "auto",
            workers: int | None = None,
            progress: Callable[..., object] | None = None, log: Callable[[str], None] = print) -> Prepared:
    """Tokenize the corpus named by ``arguments`` into ``output`` (see the module docstring).

    ``progress(total=..., unit=...)`` makes a progress bar (``seqzoo.train.progress``-like: update,
    set_postfix, close), or None for none; ``log`` receives warnings (invalid UTF-8) and notes.
    """
    began = time.perf_counter()
    if not 0 <= val < 1:
        raise DataError(f"--val {val}: the held-out fraction must be in [0, 1)")
    tok = tokenizer.tokenizer
    if tok.eos_id is None:
        raise DataError(f"the tokenizer {tokenizer.spec.get('kind')} has no end id to put between documents; give "
                        f"it one (eos_id)")
    name = dtype_for(tok.vocab_size) if dtype == "auto" else dtype
    if name not in DTYPES:
        raise DataError(f"--dtype {dtype!r}: use auto, uint16 or uint32")
    if np.iinfo(DTYPES[name]).max < tok.vocab_size - 1:
        raise DataError(f"--dtype {name}: the tokenizer has {tok.vocab_size:,} ids, more than {name} holds "
                        f"({np.iinfo(DTYPES[name]).max + 1:,}); use --dtype uint32 (or auto)")
    sources = find_sources(arguments, glob, exclude)
    folder = Path(output).expanduser()
    _check_output(folder, str(output), arguments, exclude)
    settings = {"val": val, "field": field, "glob": glob, "exclude": list(exclude), "dtype": name}
    if (folder / MANIFEST).is_file():
        try:
            old = read_manifest(folder)
        except DataError:
            old = None
        if old is not None and old.get("fingerprint") == fingerprint(sources, [s.sha256() for s in sources],
                                                                     tokenizer, settings):
            return Prepared(folder, old, True, time.perf_counter() - began)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MANIFEST).unlink(missing_ok=True)  # from here on, the folder is unfinished
    counts = [count_documents(source, field) for source in sources]
    total_documents = sum(counts)
    if total_documents == 0:
        raise DataError(f"the corpus is empty: {', '.join(a for a in arguments)} hold no document")
    writer = _Writer(folder, DTYPES[name], tok.eos_id, tok.vocab_size,
                     held=held_out_count(total_documents, val), total=total_documents)
    input_bytes = sum(s.size() for s in sources)
    # The bar counts the text's bytes; a record file's size (JSON, Parquet) is not its text's.
    total_bytes = input_bytes if all(s.format == "text" for s in sources) else None
    bar = progress(total=total_bytes, unit="B") if progress is not None else None
    hashes: list[str] = []
    inline = workers == 0 or input_bytes < INLINE_BYTES
    pool = None if inline else ProcessPoolExecutor(
        workers or min(4, os.cpu_count() or 1), mp_context=_worker_context(),
        initializer=_start_worker, initargs=(tok, name))
    if inline:
        _start_worker(tok, name)
    in_flight: collections.deque = collections.deque()
    limit = 2 * (pool._max_workers if pool is not None else 1)
    # The bar's total is the files' size; the texts' UTF-8 bytes differ from it (CRLF read as LF,
    # undecodable bytes replaced), so the count is held within the total and completed at the end.
    counted = 0

    def advance(count: int) -> None:
        nonlocal counted
        count = count if total_bytes is None else max(0, min(count, total_bytes - counted))
        counted += count
        bar.update(count)

    def drain(keep: int) -> None:
        while len(in_flight) > keep:
            future, items = in_flight.popleft()
            arrays, text_bytes = future.result() if pool is not None else future
            writer.write(items, arrays, text_bytes)
            if bar is not None:
                advance(sum(text_bytes))
                bar.set_postfix(docs=f"{writer.documents:,}", tokens=f"{writer.tokens:,}")

    try:
        index = 0
        texts: list[str] = []
        items: list[tuple[int, bool, bool]] = []  # per text: (document, starts it, ends it)
        size, starting = 0, True

        def submit() -> None:
            work = pool.submit(_encode, texts) if pool is not None else _encode(texts)
            in_flight.append((work, items))

        for source in sources:
            hasher = hashlib.sha256() if source.format == "text" else None
            for text, ends in documents(source, field, log, hasher):
                texts.append(text)
                items.append((index, starting, ends))
                size += len(text)
                starting = ends
                index += ends
                if size >= PIECE:
                    submit()
                    texts, items, size = [], [], 0
                    drain(limit)
            hashes.append(hasher.hexdigest() if hasher is not None else source.sha256())
        if texts:
            submit()
        drain(0)
        if bar is not None and total_bytes is not None:
            advance(total_bytes - counted)  # every byte of the files was read
    except BaseException:
        writer.abandon()
        raise
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
        if bar is not None:
            bar.close()
    if writer.tokens == 0:
        writer.abandon()
        raise DataError(f"the corpus is empty: {', '.join(arguments)} hold no text")
    splits = writer.finish(split_by_position=total_documents == 1, val=val)
    manifest = {
        "format": FORMAT,
        "fingerprint": fingerprint(sources, hashes, tokenizer, settings),
        "tokenizer": {"spec": tokenizer.spec, "identity": tok.identity(), "vocab_size": tok.vocab_size,
                      "eos_id": tok.eos_id},
        "dtype": name,
        "settings": settings,
        "split": "position" if total_documents == 1 else "document",
        "splits": splits,
        # [name, format, bytes, SHA-256] per source, relative to the arguments it was found under:
        # compact, as a corpus may be a hundred thousand files.
        "arguments": [str(Path(a).expanduser().resolve()) for a in arguments],
        "sources": [[s.name, s.format, s.size(), h] for s, h in zip(sources, hashes)],
    }
    if tokenizer.file_text is not None:
        write_text_atomic(folder / "tokenizer.json", tokenizer.file_text)
    write_text_atomic(folder / MANIFEST, json.dumps(manifest, indent=1) + "\n")
    return Prepared(folder, manifest, False, time.perf_counter() - began)


# -- workers ---------------------------------------------------------------------------------------
_WORKER: dict = {}


def _worker_context():
    """Fork where it is safe and cheap (Linux): a worker then starts at once instead of importing
    torch again (~1.5 s); it only tokenizes, touching neither torch nor threads. Spawn elsewhere."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods and sys.platform == "linux" else "spawn")


def _start_worker(tokenizer: Tokenizer, dtype: str) -> None:
    # Each worker is one process of several; the tokenizers library's own threads would only
    # compete with the other workers for the same cores.
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    _WORKER["tokenizer"], _WORKER["dtype"] = tokenizer, DTYPES[dtype]


def _encode(texts: list[str]) -> tuple[list[np.ndarray], list[int]]:
    """Token arrays of ``texts`` in the shard dtype, and the UTF-8 bytes of each text."""
    dtype = _WORKER["dtype"]
    encoded = _WORKER["tokenizer"].encode_documents(texts)
    arrays = []
    for ids in encoded:
        array = np.asarray(ids)
        if array.size and (array.min() < 0 or array.max() > np.iinfo(dtype).max):
            raise DataError(f"the tokenizer produced id {int(array.max())}, outside the shard dtype "
                            f"{np.dtype(dtype).name}; use --dtype uint32")
        arrays.append(array.astype(dtype, copy=False))
    return arrays, [len(t.encode("utf-8")) for t in texts]


# -- writing ---------------------------------------------------------------------------------------
class _Writer:
    """Appends tokens to ``SPLIT.bin.tmp`` and document starts to ``SPLIT.idx.tmp``; ``finish``
    renames them into place (the manifest is the caller's, last)."""

    def __init__(self, folder: Path, dtype, eos: int, vocab_size: int, *, held: int, total: int) -> None:
        self.folder, self.dtype = folder, np.dtype(dtype).newbyteorder("<")
        self.eos = np.array([eos], dtype=self.dtype)
        self.vocab_size = vocab_size
        self.files = {s: open(folder / f"{s}.bin.tmp", "wb") for s in SPLITS}
        self.starts: dict[str, list[int]] = {s: [] for s in SPLITS}
        self.sizes = dict.fromkeys(SPLITS, 0)
        self.text_bytes = dict.fromkeys(SPLITS, 0)
        self.documents = self.tokens = 0
        self.held, self.total = held, total  # held-out documents of all

    def write(self, items: list[tuple[int, bool, bool]], arrays: list[np.ndarray], text_bytes: list[int]) -> None:
        """Append the pieces ``items`` (document, starts it, ends it) with their ids and text sizes."""
        for (index, starts, ends), ids, size in zip(items, arrays, text_bytes):
            if starts and ends and ids.size == 0:
                continue  # an empty document: not even its end token
            if ids.size and int(ids.max()) >= self.vocab_size:
                raise DataError(f"the tokenizer produced id {int(ids.max())}, not below its vocab_size "
                                f"{self.vocab_size}; the tokenizer is inconsistent")
            split = "val" if held_out(index, self.total, self.held) else "train"
            if starts:
                self.starts[split].append(self.sizes[split])
                self.documents += 1
            self.files[split].write(ids.astype(self.dtype, copy=False).tobytes())
            self.sizes[split] += ids.size
            self.tokens += ids.size
            self.text_bytes[split] += size
            if ends:
                self.files[split].write(self.eos.tobytes())
                self.sizes[split] += 1
                self.tokens += 1

    def finish(self, *, split_by_position: bool, val: float) -> dict:
        for handle in self.files.values():
            handle.close()
        if split_by_position:
            self._split_by_position(val)
        splits = {}
        for split in SPLITS:
            bin_path, idx_path = self.folder / f"{split}.bin", self.folder / f"{split}.idx"
            starts = np.array([*self.starts[split], self.sizes[split]], dtype="<u8")
            if not self.starts[split]:
                starts = np.array([0], dtype="<u8")
            with open(self.folder / f"{split}.idx.tmp", "wb") as handle:
                handle.write(starts.tobytes())
            for suffix in ("bin", "idx"):
                tmp = self.folder / f"{split}.{suffix}.tmp"
                with open(tmp, "rb+") as handle:
                    os.fsync(handle.fileno())
                os.replace(tmp, self.folder / f"{split}.{suffix}")
            splits[split] = {
                "tokens": self.sizes[split], "documents": len(starts) - 1, "text_bytes": self.text_bytes[split],
                "tokens_file": {"bytes": bin_path.stat().st_size, "sha256": file_sha256(bin_path)},
                "index_file": {"bytes": idx_path.stat().st_size, "sha256": file_sha256(idx_path)},
            }
        return splits

    def _split_by_position(self, val: float) -> None:
        """One document: its last ``val`` fraction of tokens becomes the held-out split."""
        total = self.sizes["train"]
        held = round(total * val)
        cut = total - held
        item = self.dtype.itemsize
        train, held_file = self.folder / "train.bin.tmp", self.folder / "val.bin.tmp"
        with open(train, "rb+") as source, open(held_file, "wb") as target:
            source.seek(cut * item)
            shutil.copyfileobj(source, target, 1 << 24)
            source.truncate(cut * item)
        whole = self.text_bytes["train"]
        self.text_bytes = {"train": round(whole * cut / total), "val": whole - round(whole * cut / total)}
        self.sizes = {"train": cut, "val": held}
        self.starts = {"train": [0], "val": [0] if held else []}

    def abandon(self) -> None:
        """Close and remove the temporary files of an unfinished prepare."""
        for split, handle in self.files.items():
            handle.close()
            for suffix in ("bin", "idx"):
                (self.folder / f"{split}.{suffix}.tmp").unlink(missing_ok=True)
