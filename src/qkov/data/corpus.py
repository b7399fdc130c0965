"""Finding and reading the text a model is trained on.

The default corpus is the source code of the Python standard library that ships with the running
interpreter (``sysconfig.get_paths()["stdlib"]``, without ``site-packages``): real code that nobody
here wrote, in which the paper's Python skip-trigrams (``def ... ( -> self``) can be found.
"""

from __future__ import annotations

import glob
import hashlib
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


@dataclass(frozen=True)
class Corpus:
    """Decoded documents in a deterministic order, and how many files were skipped."""

    documents: tuple[Document, ...]
    skipped: int

    def fingerprint(self) -> str:
        """A digest of every document's path and text: the key of cached tokenizers and tokens."""
        digest = hashlib.sha256()
        for doc in self.documents:
            for part in (doc.path, doc.text):
                data = part.encode("utf-8", "surrogatepass")
                digest.update(len(data).to_bytes(8, "little"))
                digest.update(data)
        return digest.hexdigest()[:24]


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


def read_corpus(patterns: list[str] | None = None) -> Corpus:
    """Read the corpus: the standard library's source by default, else the given paths.

    Undecodable and binary files are skipped and counted; a corpus with no text left is an error.
    """
    root = stdlib_root()
    files = stdlib_files(root) if not patterns else expand(patterns)
    documents, skipped = [], 0
    for path in files:
        try:
            text = decode(path.read_bytes())
        except OSError:
            text = None
        if text is None:
            skipped += 1
        elif text.strip():
            name = str(path.relative_to(root)) if not patterns else str(path)
            documents.append(Document(name, text))
    if not documents:
        where = "the standard library" if not patterns else ", ".join(patterns)
        raise QkovError(f"corpus: no text in {where} ({len(files)} file(s), {skipped} binary or undecodable)")
    return Corpus(tuple(documents), skipped)
