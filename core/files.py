"""Atomic file writes: the one writer seqzoo uses for checkpoints and exported folders.

``atomic_write(path, write)`` has ``write`` fill a temp file beside ``path``, gives it the mode a
plain ``open()`` would (``0o666`` less the umask: 0644 normally; ``mkstemp`` alone leaves 0600,
unreadable by anyone else), flushes it to disk, renames it over ``path`` and flushes the folder. A
crash at any moment leaves either the old file or the complete new one, never a partial file; a
failed write removes its temp file and leaves the old target as it was.
"""
from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from .errors import InputError, OutputIsFolder

_UMASK_LOCK = threading.Lock()


class FolderNotWritable(OSError):
    """The temp file could not be created beside the target: nothing was written or touched."""


def umask() -> int:
    """The process umask, without changing it (as far as other threads can tell)."""
    # Linux (4.7+) reports it in /proc; reading it there never changes the process state.
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    # Elsewhere the only way to read it is to set it; the lock keeps two seqzoo writers from
    # seeing each other's temporary 0, and it is restored at once.
    with _UMASK_LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def refuse_folder(path: str | os.PathLike, example: str, option: str | None = None) -> None:
    """Refuse an output file ``path`` that is an existing folder, suggesting the file ``example``
    inside it (``option``: the command-line option that gave the path, named first). Every command
    that writes a file says it in these words; a command calls it before its work, so a long run
    never ends with nowhere to put its result."""
    path = Path(path)
    if path.is_dir():
        given = f"{option} {path}" if option else str(path)
        raise OutputIsFolder(f"{given}: is a directory; give a file name such as {path / example}")


def check_output_file(path: str | os.PathLike, example: str, option: str | None = None) -> None:
    """``refuse_folder``, and refuse a ``path`` whose folder does not exist: the checks a command
    makes before its work on an output file it does not create folders for."""
    refuse_folder(path, example, option)
    folder = Path(path).parent
    if not folder.is_dir():
        given = f"{option} {path}" if option else str(path)
        raise InputError(f"{given}: the folder {folder} does not exist; create it first (mkdir -p {folder})")


def file_in_the_way(folder: str | os.PathLike) -> Path | None:
    """The file that stands where ``folder`` (or a folder above it) would be made, as ``mkdir -p``
    would meet it; None when the folder exists or can be made."""
    existing = Path(folder)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    return existing if existing.exists() and not existing.is_dir() else None


def atomic_write(path: Path, write: Callable[[str], object]) -> None:
    """Write ``path`` atomically: ``write(tmp)`` fills a temp file in the same folder, which then
    replaces ``path`` with the mode ``open()`` would give it (``0o666 & ~umask``).

    Raises ``OutputIsFolder`` (a SeqzooError and an IsADirectoryError) when ``path`` is a folder,
    before ``write`` runs; ``FolderNotWritable`` (an OSError) when no temp file can be made in the
    folder; and re-raises whatever ``write``, the fsync or the rename raise, after deleting the
    temp file.
    """
    path = Path(path)
    # Checked here as well as by the commands: the rename would fail only after ``write`` had done
    # its work, with an OSError naming the temp file rather than the path given.
    refuse_folder(path, f"file{path.suffix}")
    folder = path.parent
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as error:
        raise FolderNotWritable(error.errno, error.strerror or str(error), str(folder)) from error
    os.close(fd)
    try:
        write(tmp)
        # After write: a writer that recreates the file (rather than filling it) would reset it.
        os.chmod(tmp, 0o666 & ~umask())
        with open(tmp, "rb+") as handle:  # rb+: Windows cannot flush a read-only handle
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(folder)


def write_text_atomic(path: Path, text: str, encoding: str = "utf-8") -> None:
    """``atomic_write`` of a text file."""
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding=encoding))


def fsync_dir(folder: Path) -> None:
    """Flush a folder's entries (a rename) to disk, where the platform can."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return  # Windows cannot open a folder; its renames are flushed with the file
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems cannot fsync a directory; the rename is still atomic
    finally:
        os.close(fd)
