"""The documents of a corpus: text files (one document each), JSON lines / JSON / Parquet files
(one document per record, its ``field``) and folders written by ``datasets.Dataset.save_to_disk``.

Structured files are read through Hugging Face ``datasets`` (the ``seqzoo[data]`` extra), in
streaming mode, so no corpus is ever held in memory and no Arrow cache is written; a text file is
read in pieces of about a mebibyte, cut at a line start, so one file larger than memory streams too.
Text must be UTF-8: a file with a NUL byte is not text and is refused; invalid UTF-8 sequences are
replaced (U+FFFD) and reported once per file with their count and the first byte offset.
"""
from __future__ import annotations

import codecs
import fnmatch
import hashlib
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from .shards import DataError, file_sha256

#: File suffixes read as records rather than text.
RECORD_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
#: A folder with these files is a ``Dataset.save_to_disk`` folder (a ``DatasetDict`` has the last).
DATASET_MARKERS = (("dataset_info.json", "state.json"), ("dataset_dict.json",))
PIECE = 1 << 20  # characters of text per piece handed to a tokenizer
_INVALID = re.compile("[\udc80-\udcff]")  # bytes that were not UTF-8, as surrogateescape decodes them


@dataclass(frozen=True, slots=True)
class Source:
    """One input: a file or a dataset folder (``location``), its ``name`` relative to the argument
    that found it (what the fingerprint records, so moving a corpus does not change it) and its
    ``format``: ``text``, ``json``, ``parquet`` or ``arrow`` (a ``save_to_disk`` folder). Plain
    strings and slots: a corpus of a hundred thousand files keeps a hundred thousand of these."""

    location: str
    name: str
    format: str

    @property
    def path(self) -> Path:
        return Path(self.location)

    def size(self) -> int:
        if self.path.is_dir():
            return sum(f.stat().st_size for f in _files(self.path))
        return self.path.stat().st_size

    def sha256(self) -> str:
        """The file's SHA-256; for a dataset folder, the hash of its files' names and hashes."""
        if not self.path.is_dir():
            return file_sha256(self.path)
        digest = hashlib.sha256()
        for file in _files(self.path):
            digest.update(f"{file.relative_to(self.path).as_posix()}:{file_sha256(file)}\n".encode())
        return digest.hexdigest()


def _files(folder: Path) -> list[Path]:
    return sorted(f for f in folder.rglob("*") if f.is_file() and not _hidden(f.relative_to(folder)))


def _hidden(relative: Path) -> bool:
    return any(part.startswith(".") or part == "__pycache__" for part in relative.parts)


def is_dataset_folder(folder: Path) -> bool:
    return any(all((folder / marker).is_file() for marker in markers) for markers in DATASET_MARKERS)


def find_sources(arguments: list[str], glob: str | None = None, exclude: tuple[str, ...] = ()) -> list[Source]:
    """The inputs named on the command line, in order; a folder contributes its files (sorted by
    path, recursively, hidden ones and ``__pycache__`` skipped, kept when they match ``glob`` and
    no ``exclude`` pattern; an excluded folder is not entered) and the dataset folders inside it.
    Patterns are shell patterns matched against the path relative to the folder, whole or by its
    tail: ``*.py``, ``site-packages``, ``test/data``."""
    sources: list[Source] = []
    for argument in arguments:
        path = Path(argument).expanduser()
        if not path.exists():
            raise DataError(f"{argument}: no such file or folder")
        if path.is_dir() and is_dataset_folder(path):
            sources.append(Source(str(path), path.name, "arrow"))
        elif path.is_dir():
            found = _folder_sources(path, glob, exclude)
            if not found:
                what = f"no file matching --glob {glob!r}" if glob else "no file"
                raise DataError(f"{argument}: {what} in this folder")
            sources.extend(found)
        else:
            sources.append(Source(str(path), path.name, RECORD_FORMATS.get(path.suffix.lower(), "text")))
    return sources


def _folder_sources(folder: Path, glob: str | None, exclude: tuple[str, ...]) -> list[Source]:
    found = []
    top = len(str(folder)) + 1
    for root, dirs, files in os.walk(folder):
        prefix = root[top:].replace(os.sep, "/")
        prefix = f"{prefix}/" if prefix else ""
        keep = []
        for name in dirs:
            relative = prefix + name
            if skipped(name, relative, exclude):
                continue
            path = Path(root, name)
            if is_dataset_folder(path):  # a dataset is one source; its Arrow files are not text
                found.append(Source(str(path), relative, "arrow"))
            else:
                keep.append(name)
        dirs[:] = keep
        for name in files:
            relative = prefix + name
            if skipped(name, relative, exclude) or (glob is not None and not _matches(relative, glob)):
                continue
            kind = RECORD_FORMATS.get(os.path.splitext(name)[1].lower(), "text")
            found.append(Source(os.path.join(root, name), relative, sys.intern(kind)))
    return sorted(found, key=lambda source: source.name)


def _matches(relative: str, pattern: str) -> bool:
    """Whether a relative path matches a shell pattern, whole or by its tail (``*.py``, ``site-packages``,
    ``test/data``)."""
    return fnmatch.fnmatchcase(relative, pattern) or fnmatch.fnmatchcase(relative, "*/" + pattern)


def skipped(name: str, relative: str, exclude: tuple[str, ...]) -> bool:
    return name.startswith(".") or name == "__pycache__" or any(_matches(relative, p) for p in exclude)


# -- counting documents ------------------------------------------------------------------------------
def count_documents(source: Source, field: str) -> int:
    """How many documents ``source`` holds (1 for a text file), without reading the text:
    JSON lines are counted by their non-blank lines, Parquet by its metadata, a dataset folder by
    its rows; a JSON array is streamed once."""
    if source.format == "text":
        return 1
    if source.format == "json" and _is_json_lines(source.path):
        count = 0
        with open(source.path, "rb") as handle:
            for line in handle:
                count += bool(line.strip())
        return count
    if source.format == "parquet":
        import pyarrow.parquet as pq  # installed with datasets

        try:
            return pq.ParquetFile(source.path).metadata.num_rows
        except Exception as error:  # pyarrow raises ArrowInvalid and OSError subclasses
            raise DataError(f"{source.path}: not a readable Parquet file ({_first_line(error)})") from None
    if source.format == "arrow":
        return sum(len(split) for split in _dataset_splits(source))
    return sum(1 for _ in _records(source, field))


def _is_json_lines(path: Path) -> bool:
    """Whether a .json/.jsonl file is JSON lines (one object per line) rather than one document."""
    if path.suffix.lower() == ".jsonl":
        return True
    with open(path, "rb") as handle:
        head = handle.read(4096).lstrip()
    return not head.startswith(b"[")


# -- reading documents -------------------------------------------------------------------------------
def documents(source: Source, field: str, warn: Callable[[str], None], hasher=None) -> Iterator[tuple[str, bool]]:
    """The text of ``source``'s documents as (piece, ends_document) pairs: a text file in pieces of
    about ``PIECE`` characters, a record in one piece. ``hasher`` (a hashlib object) is fed the
    bytes of a text file as they are read, so it is hashed without a second pass."""
    if source.format == "text":
        yield from _text_pieces(source.path, warn, hasher)
        return
    for text in _records(source, field):
        yield text, True


def _text_pieces(path: Path, warn: Callable[[str], None], hasher=None) -> Iterator[tuple[str, bool]]:
    decoder = codecs.getincrementaldecoder("utf-8")(errors="surrogateescape")
    invalid, first_invalid = 0, None
    read = decoded = 0  # bytes read from the file; bytes that became text (the decoder may hold a few)
    pending = ""
    with open(path, "rb") as handle:
        while True:
            chunk = handle.read(PIECE)
            if hasher is not None:
                hasher.update(chunk)
            if b"\x00" in chunk:
                offset = read + chunk.index(b"\x00")
                raise DataError(f"{path}: not text (a NUL byte at offset {offset:,}) and not a known record format "
                                f"(.jsonl, .json, .parquet, a datasets folder); drop it, or choose files with --glob")
            read += len(chunk)
            text = decoder.decode(chunk, final=not chunk)
            found = _INVALID.search(text)
            if found is not None:
                if first_invalid is None:
                    first_invalid = decoded + _byte_length(text[:found.start()])
                invalid += len(_INVALID.findall(text))
            decoded += _byte_length(text)
            if found is not None:
                text = _INVALID.sub("\ufffd", text)
            pending += text
            if not chunk:
                break
            cut = _piece_end(pending)
            if cut:
                yield pending[:cut], False
                pending = pending[cut:]
    if invalid:
        warn(f"{path}: {invalid:,} byte(s) are not UTF-8 (the first at byte offset {first_invalid:,}); each was "
             f"replaced by U+FFFD")
    yield pending, True


def _byte_length(text: str) -> int:
    """The bytes ``text`` was decoded from (surrogateescape round-trips invalid bytes exactly)."""
    return len(text.encode("utf-8", errors="surrogateescape"))


def _piece_end(text: str) -> int:
    """Where to cut ``text`` so a tokenizer sees whole lines: after the last newline (within the
    last ``PIECE`` characters) that is followed by a non-space character; 0 to keep reading. A
    piece over 4·PIECE with no such newline is cut at its end."""
    if len(text) < PIECE:
        return 0
    floor, at = len(text) - PIECE, len(text) - 1
    while (at := text.rfind("\n", floor, at)) >= 0:
        if not text[at + 1].isspace():
            return at + 1
    return len(text) if len(text) >= 4 * PIECE else 0


def _dataset_splits(source: Source) -> list:
    datasets = _datasets()
    try:
        loaded = datasets.load_from_disk(str(source.path))
    except Exception as error:  # datasets raises FileNotFoundError, ValueError and its own errors
        raise DataError(f"{source.path}: not a readable datasets folder ({_first_line(error)})") from None
    if isinstance(loaded, datasets.DatasetDict):
        return [loaded[name] for name in sorted(loaded)]
    return [loaded]


def _records(source: Source, field: str) -> Iterator[str]:
    """The ``field`` of every record, through ``datasets`` (streaming for files)."""
    if source.format == "arrow":
        parts = _dataset_splits(source)
    else:
        datasets = _datasets()
        try:
            parts = [datasets.load_dataset(source.format, data_files=str(source.path), split="train",
                                           streaming=True)]
        except Exception as error:
            raise _read_error(source, error, field) from None
    index = 0
    # datasets gives None both for a null and for a JSON record without the field (its columns are
    # the union of the records' keys); the file tells them apart, read once at the first None.
    absent_checked = source.format != "json"
    for part in parts:
        try:
            for batch in part.iter(batch_size=1000):
                if field not in batch:
                    fields = ", ".join(sorted(batch)) or "none"
                    raise DataError(f"{source.path}: records have no field {field!r} (fields: {fields}); "
                                    f"choose one with --field")
                for value in batch[field]:
                    if value is None and not absent_checked:
                        _refuse_absent_field(source, field)
                        absent_checked = True
                    if value is None:
                        value = ""  # a null is an empty document
                    if not isinstance(value, str):
                        raise DataError(f"{_record_at(source, index)} has a {type(value).__name__} in "
                                        f"field {field!r}, not text; choose a text field with --field")
                    index += 1
                    yield value
        except DataError:
            raise
        except Exception as error:  # a parse error surfaces while iterating a stream
            raise _read_error(source, error, field) from None


def _json_records(source: Source) -> Iterator[tuple[str, object]]:
    """A JSON source's records with where each is (``file:line: the record`` for JSON lines,
    ``file: record N`` in a JSON list or object); read with ``json``, for the messages datasets'
    errors cannot give. A .json file is one JSON document when it parses as one (an object over
    several lines too), else JSON lines, as datasets reads it."""
    if source.path.suffix.lower() == ".json":
        try:
            with open(source.path, "rb") as handle:
                records = json.load(handle)
        except (json.JSONDecodeError, UnicodeDecodeError):
            pass  # JSON lines, read below
        else:
            for number, record in enumerate(records if isinstance(records, list) else [records], 1):
                yield f"{source.path}: record {number}", record
            return
    with open(source.path, "rb") as handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                yield f"{source.path}:{number}: the record", json.loads(line)


def _record_at(source: Source, index: int) -> str:
    """Where record ``index`` (from 0) is: ``file:line`` in JSON lines, else ``file: record N``."""
    if source.format == "json":
        for number, (where, _) in enumerate(_json_records(source)):
            if number == index:
                return where
    return f"{source.path}: record {index + 1}"


def _refuse_absent_field(source: Source, field: str) -> None:
    """Refuse the first record of a JSON source without ``field``: dropping it would lose a
    document unsaid, and reading it as empty would hide the mistake."""
    for where, record in _json_records(source):
        if isinstance(record, dict) and field not in record:
            keys = ", ".join(sorted(record)) or "none"
            raise DataError(f"{where} has no field {field!r} (its fields: {keys}); give every record "
                            f"the text in {field!r}, or choose the field that holds it with --field")


def _read_error(source: Source, error: Exception, field: str) -> DataError:
    """A one-line error for a file ``datasets`` could not read: for JSON lines, the first line
    that is not JSON, by number (datasets' own message names neither file nor line); for a .json
    file that is valid JSON as a whole, what about it is not a list of records."""
    if source.format == "json" and source.path.suffix.lower() == ".json":
        try:
            with open(source.path, "rb") as handle:
                whole = json.load(handle)
        except (json.JSONDecodeError, UnicodeDecodeError):
            pass  # not one JSON document: perhaps JSON lines, looked at below
        else:
            return _not_records(source, whole, field, error)
    if source.format == "json" and _is_json_lines(source.path):
        with open(source.path, "rb") as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    json.loads(line)
                except (json.JSONDecodeError, UnicodeDecodeError) as bad:
                    return DataError(f"{source.path}:{number}: not JSON ({bad}); each line of a .jsonl file is "
                                     f"one JSON object")
    return DataError(f"{source.path}: could not be read as {source.format} ({_first_line(error)})")


def _not_records(source: Source, whole: object, field: str, error: Exception) -> DataError:
    """What keeps a valid .json file from being read as records: its top level, or a record."""
    shape = "a JSON list of objects or JSON lines (one object per line)"
    if isinstance(whole, dict) and field not in whole:
        return DataError(f"{source.path}: one JSON object with no field {field!r} (its keys: "
                         f"{', '.join(sorted(whole)) or 'none'}), not records; give {shape}, each with its text "
                         f"in {field!r} (or name the field with --field)")
    if not isinstance(whole, (dict, list)):
        return DataError(f"{source.path}: a JSON {type(whole).__name__}, not records; give {shape}")
    for number, record in enumerate(whole if isinstance(whole, list) else [], 1):
        if not isinstance(record, dict):
            return DataError(f"{source.path}: record {number} is a JSON {type(record).__name__}, not an object; "
                             f"give {shape}")
    return DataError(f"{source.path}: could not be read as json ({_first_line(error)})")


def _datasets():
    try:
        import datasets
    except ImportError:
        raise DataError("reading .jsonl, .json, .parquet and datasets folders needs Hugging Face datasets: "
                        "pip install 'seqzoo[data]'") from None
    datasets.disable_progress_bars()  # seqzoo shows its own
    # Its JSON reader logs a parse error ("Failed to load JSON ... ArrowInvalid") and then raises
    # it; seqzoo reports the raised error in its own line, so the logged copy is only noise.
    logging.getLogger("datasets.packaged_modules.json.json").setLevel(logging.CRITICAL)
    return datasets


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__

