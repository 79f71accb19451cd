"""Atomic writes (``seqzoo.files``): checkpoints and exported Hugging Face folders get the mode the
umask gives, as ``open()`` would (not mkstemp's 0600), and a failed write changes nothing."""
from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

import seqzoo
from seqzoo import files
from seqzoo.errors import SeqzooError
from seqzoo.files import FolderNotWritable, atomic_write, write_text_atomic

posix_only = pytest.mark.skipif(os.name != "posix", reason="file modes are POSIX")


@pytest.fixture
def set_umask() -> Iterator:
    """Set the process umask for one test; the old one comes back after it."""
    old = os.umask(0o022)
    os.umask(old)
    yield os.umask
    os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@posix_only
@pytest.mark.parametrize(("umask", "expected"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_checkpoint_gets_the_umask_mode(tmp_path, tiny_gpt, set_umask, umask, expected):
    set_umask(umask)
    path = seqzoo.save(tiny_gpt, tmp_path / "m.safetensors")
    assert oct(mode(path)) == oct(expected)


@posix_only
@pytest.mark.parametrize(("umask", "expected"), [(0o022, 0o644), (0o077, 0o600)])
def test_every_file_of_an_exported_hf_folder_gets_the_umask_mode(tmp_path, tiny_gpt, set_umask,
                                                                   umask, expected):
    set_umask(umask)
    folder = seqzoo.to_hf(tiny_gpt, tmp_path / "out")
    written = sorted(folder.iterdir())
    assert {"config.json", "model.safetensors"} <= {p.name for p in written}
    assert {p.name: oct(mode(p)) for p in written} == {p.name: oct(expected) for p in written}


def test_failed_write_leaves_no_temp_file_and_the_old_target(tmp_path):
    path = tmp_path / "f.txt"
    write_text_atomic(path, "old")

    def half_then_fail(tmp: str) -> None:
        Path(tmp).write_text("half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left on device"):
        atomic_write(path, half_then_fail)
    assert path.read_text() == "old"
    assert os.listdir(tmp_path) == ["f.txt"]


def test_interrupted_write_leaves_no_temp_file(tmp_path):
    def interrupted(tmp: str) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(tmp_path / "f.txt", interrupted)
    assert os.listdir(tmp_path) == []


def test_write_replaces_the_target_and_leaves_no_temp_file(tmp_path):
    path = tmp_path / "f.txt"
    write_text_atomic(path, "one")
    write_text_atomic(path, "héllo\n")
    assert path.read_text(encoding="utf-8") == "héllo\n"
    assert os.listdir(tmp_path) == ["f.txt"]


def test_missing_folder_is_folder_not_writable(tmp_path):
    with pytest.raises(FolderNotWritable) as info:
        write_text_atomic(tmp_path / "gone" / "f.txt", "x")
    assert isinstance(info.value, OSError) and info.value.filename == str(tmp_path / "gone")


def test_a_folder_as_the_target_is_refused_by_name_before_the_write(tmp_path):
    (tmp_path / "out").mkdir()
    called = []
    with pytest.raises(SeqzooError) as info:
        atomic_write(tmp_path / "out", called.append)
    folder = tmp_path / "out"
    assert str(info.value) == f"{folder}: is a directory; give a file name such as {folder / 'file'}"
    assert isinstance(info.value, IsADirectoryError)  # code that tolerates a failed write still catches it
    assert called == [] and os.listdir(tmp_path) == ["out"]  # no work done, no temp file left


@posix_only
def test_umask_is_read_without_changing_it(set_umask, monkeypatch):
    set_umask(0o027)
    assert files.umask() == 0o027

    def no_proc(*args, **kwargs):
        raise OSError(2, "No such file or directory")

    monkeypatch.setattr(files, "open", no_proc, raising=False)  # the fallback, as off Linux
    assert files.umask() == 0o027
    assert os.umask(0o027) == 0o027  # still set as it was
