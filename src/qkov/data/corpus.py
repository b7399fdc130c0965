"""Finding the text a model is trained on, and decoding a text file (the documents are streamed by
:mod:`qkov.data.sources`).

The default corpus is the source code of the Python standard library that ships with the running
interpreter (``sysconfig.get_paths()["stdlib"]``, without ``site-packages``): real code that nobody
here wrote, in which the paper's Python skip-trigrams (``def ... ( -> self``) can be found.
"""

from __future__ import annotations

import glob
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from qkov.errors import QkovError

#: Folders of the standard library left out of the default corpus: third-party packages.
EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})


@dataclass(frozen=True)
class Document:
    path: str
    text: str


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path) -> list[Path]:
    """The ``.py`` files of the standard library, sorted, third-party packages excluded."""
    files = [
        path
        for path in root.rglob("*.py")
        if not EXCLUDED_DIRS.intersection(path.relative_to(root).parts[:-1]) and path.is_file()
    ]
    return sorted(files)


def expand(patterns: list[str]) -> list[Path]:
    """Files named by paths, folders (searched recursively) or globs, sorted and deduplicated."""
    files: set[Path] = set()
    for pattern in patterns:
        matches = glob.glob(pattern, recursive=True) if glob.has_magic(pattern) else [pattern]
        if not matches:
            raise QkovError(f"corpus: {pattern!r} matches no file")
        for match in map(Path, matches):
            if match.is_dir():
                files.update(p for p in match.rglob("*") if p.is_file())
            elif match.is_file():
                files.add(match)
            else:
                raise QkovError(f"corpus: {match} does not exist")
    return sorted(files)


def decode(data: bytes) -> str | None:
    """UTF-8 text, or None for binary (a NUL byte) or undecodable data."""
    if b"\x00" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None
