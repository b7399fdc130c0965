"""Atomic writes: the file is complete or untouched, never half-written, with the usual mode."""

from __future__ import annotations

import os

import pytest

from qkov.errors import QkovError
from qkov.io import atomic_write, atomic_write_text, check_writable_folder, read_json


def test_a_write_replaces_the_file_whole(tmp_path):
    file = tmp_path / "sub" / "out.txt"
    atomic_write_text(file, "first")
    atomic_write_text(file, "second")
    assert file.read_text() == "second" and os.listdir(file.parent) == ["out.txt"]
    umask = os.umask(0)
    os.umask(umask)
    assert file.stat().st_mode & 0o777 == 0o666 & ~umask


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    file = tmp_path / "out.txt"
    atomic_write_text(file, "old")

    def fail(tmp):
        tmp.write_text("half")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        atomic_write(file, fail)
    assert file.read_text() == "old" and os.listdir(tmp_path) == ["out.txt"]


def test_a_killed_writes_temporary_is_removed_by_the_next_write(tmp_path):
    """A temporary of a process that is gone (a killed write) goes; a live process' stays."""
    import subprocess
    import sys

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
    dead = tmp_path / f".model.safetensors.{int(gone.stdout)}.abc123.tmp"
    alive = tmp_path / f".model.safetensors.{os.getppid()}.def456.tmp"
    dead.write_bytes(b"half")
    alive.write_bytes(b"half")
    atomic_write_text(tmp_path / "config.json", "{}")
    assert not dead.exists() and alive.exists()


def test_written_files_get_the_usual_permissions_whatever_the_writer_does(tmp_path):
    def write(tmp):
        tmp.unlink()
        fd = os.open(tmp, os.O_CREAT | os.O_WRONLY, 0o600)  # as the safetensors writer did
        os.close(fd)

    atomic_write(tmp_path / "w", write)
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "w").stat().st_mode & 0o777 == 0o666 & ~umask


@pytest.mark.parametrize(
    ("out", "words"),
    [
        ("/proc/qkov-out", "cannot write in /proc"),
        ("{tmp}/file/sub", "is not a folder"),
        ("{tmp}/file", "exists and is not a folder"),
        ("{tmp}/" + "x" * 300, "longer than"),
        ("{tmp}/a\0b", "NUL"),
    ],
)
def test_an_output_folder_that_cannot_be_written_is_one_line_and_nothing_made(tmp_path, out, words):
    (tmp_path / "file").write_text("")
    before = sorted(tmp_path.iterdir())
    with pytest.raises(QkovError, match=words):
        check_writable_folder(out.format(tmp=tmp_path))
    assert sorted(tmp_path.iterdir()) == before
    assert check_writable_folder(tmp_path / "new" / "deeper") == tmp_path / "new" / "deeper"
    assert sorted(tmp_path.iterdir()) == before


def test_deeply_nested_or_huge_json_is_one_line(tmp_path):
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (tmp_path / "digits.json").write_text("9" * 5000)
    for name, words in (("deep.json", "nested too deeply"), ("digits.json", "4300 digits")):
        with pytest.raises(QkovError, match=words):
            read_json(tmp_path / name)


def test_a_full_disk_is_one_line_and_leaves_the_file_as_it_was(tmp_path):
    """The environment failing under a write (ENOSPC from the filesystem) is one line naming the
    file, the old file untouched and no temporary left (it was a traceback)."""
    import errno

    target = tmp_path / "report.html"
    target.write_text("old")

    def full(tmp):
        tmp.write_text("half")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(QkovError, match=r"report.html: could not be written \(No space left on device\)"):
        atomic_write(target, full)
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]
