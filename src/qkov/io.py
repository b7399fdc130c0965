"""Atomic file writes: a temporary file in the same folder, then a rename.

A reader (or a run killed half-way) never sees a half-written file: it sees the old one or the new.
A run killed during a write leaves its hidden temporary file (``.NAME.PID.XXXX.tmp``) behind; the next
write into that folder removes those whose process is gone. :func:`check_writable_folder` tells,
before any work, whether a command's output folder can be written.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from qkov.errors import QkovError

NAME_MAX = 255  # the longest file name of Linux, macOS and Windows file systems, in bytes
STALE_SECONDS = 3600  # a temporary file without a process id (older qkov) is stale after this


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return pid > 0  # another user's process, or no such id
    return True


def remove_stale_temporaries(folder: Path) -> list[Path]:
    """Remove the hidden temporary files (``.NAME.PID.XXXX.tmp``) of atomic writes that were killed:
    those whose process is no longer running (or, without a process id, older than an hour).
    Returns what was removed."""
    removed = []
    try:
        candidates = [p for p in folder.iterdir() if p.name.startswith(".") and p.name.endswith(".tmp")]
    except OSError:
        return removed
    for tmp in candidates:
        parts = tmp.name[1:-4].rsplit(".", 2)
        try:
            if len(parts) == 3 and parts[1].isdecimal() and parts[1].isascii():
                stale = int(parts[1]) != os.getpid() and not process_alive(int(parts[1]))
            else:
                stale = time.time() - tmp.lstat().st_mtime > STALE_SECONDS
            if stale and tmp.is_file() and not tmp.is_symlink():
                tmp.unlink()
                removed.append(tmp)
        except OSError:
            continue
    return removed


def usual_mode() -> int:
    """The permissions a file created with ``open`` gets under this process' umask (0644 usually)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def atomic_write(path: str | os.PathLike, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp_path)`` and rename the result onto ``path`` once it is complete; the file
    gets the usual permissions (whatever ``write`` created it with), and a killed write's leftover
    temporary files in the folder are removed first."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, usual_mode())  # mkstemp makes 0600, and a writer may replace the file
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:  # the disk full, the folder gone or unwritable: the environment, in one line
        Path(tmp).unlink(missing_ok=True)
        raise QkovError(f"{path}: could not be written ({err.strerror or err}); it is as it was") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


LFS_POINTER = b"version https://git-lfs.github.com/spec"


def check_not_lfs_pointer(file: Path) -> None:
    """One line for a weights file that is a git-lfs pointer (a small text file naming the real one),
    which a clone without ``git lfs`` leaves in place of the weights."""
    try:
        with open(file, "rb") as f:
            head = f.read(len(LFS_POINTER))
    except OSError:
        return
    if head == LFS_POINTER:
        raise QkovError(
            f"{file}: a git-lfs pointer, not the weights (run `git lfs pull` in its repository, or download "
            "the file itself)"
        )


def read_json(file: Path) -> Any:
    """Parsed JSON, or one :class:`QkovError` line naming the file when it is not valid JSON text."""
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise QkovError(f"{file}: not valid JSON ({err})") from None
    except RecursionError:
        raise QkovError(f"{file}: not valid JSON (nested too deeply)") from None
    except ValueError as err:  # an integer of more than 4,300 digits
        raise QkovError(f"{file}: not valid JSON ({str(err).split(':')[0]})") from None
    except OSError as err:
        raise QkovError(f"{file}: cannot be read ({err.strerror or type(err).__name__})") from None


def check_writable_folder(folder: str | os.PathLike, option: str = "--out") -> Path:
    """One :class:`QkovError` line, before any work, when ``folder`` cannot be made or written: a
    file in the way, a name too long or holding a NUL, no permission, a read-only file system.
    Creates nothing (a probe folder made in its nearest existing parent is removed at once)."""
    path = Path(folder)
    if "\0" in str(path):
        raise QkovError(f"{option} {str(path)!r}: a path cannot hold a NUL character")
    too_long = [part for part in path.parts if len(os.fsencode(part)) > NAME_MAX]
    if too_long:
        raise QkovError(f"{option} {path}: a name in it is longer than {NAME_MAX} bytes")
    try:
        if path.exists() and not path.is_dir():
            raise QkovError(f"{option} {path}: exists and is not a folder")
        parent = path
        while not parent.exists() and parent.parent != parent:
            parent = parent.parent
        if not parent.is_dir():
            raise QkovError(f"{option} {path}: {parent} is not a folder")
        os.rmdir(tempfile.mkdtemp(dir=parent, prefix=".qkov-probe-"))
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise QkovError(f"{option} {path}: cannot write in {parent} ({reason})") from None
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def checkpoint_folder(path: str | os.PathLike) -> Path:
    """The folder a model is read from: ``path`` itself, or the folder of a file in it (its
    ``model.safetensors``, ``config.json``); one line when there is no such folder."""
    folder = Path(path)
    if folder.is_file() and folder.suffix in (".json", ".safetensors"):
        folder = folder.parent
    if folder.is_file():
        raise QkovError(
            f"{folder}: a file, not a model's folder (qkov import reads a weights file of its own)"
        )
    if not folder.is_dir():
        raise QkovError(f"{folder}: no such checkpoint folder")
    return folder
