"""Atomic writes: the file is complete or untouched, never half-written, with the usual mode."""

from __future__ import annotations

import os

import pytest

from qkov.io import atomic_write, atomic_write_text


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
