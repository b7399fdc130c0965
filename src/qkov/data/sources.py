"""Documents streamed from corpus files of any size: text files, JSON Lines (plain, ``.gz`` or
``.zst``) and Parquet, one document at a time, so that no corpus needs to fit in memory.

A JSON Lines file holds one JSON object per line, its text under ``text_field`` (``"text"`` by
default); a Parquet file holds a column of that name. Every other file is read as UTF-8 text
(binary and undecodable files are skipped and counted, as in :mod:`qkov.data.corpus`). Bad input
is one :class:`QkovError` naming the file (and the 1-based line of a JSON Lines file).
"""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from qkov.data.corpus import Document, decode, expand, stdlib_files, stdlib_root
from qkov.errors import QkovError

TEXT_FIELD = "text"
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst")
INSTALL = "pip install 'qkov[corpora]'"
PARQUET_ROWS = 1024  # rows read from a Parquet file at a time


@dataclass
class CorpusFiles:
    """The files of a corpus, in a deterministic order, and how its documents are found in them."""

    files: list[Path]
    text_field: str = TEXT_FIELD
    root: Path | None = None  # names of the default corpus' documents are relative to it
    skipped: int = field(default=0, compare=False)  # binary or undecodable text files

    @classmethod
    def find(cls, patterns: list[str] | None, text_field: str = TEXT_FIELD) -> CorpusFiles:
        """Files named by paths, folders or globs; the standard library's source when none."""
        if patterns:
            return cls(expand(patterns), text_field)
        return cls(stdlib_files(stdlib_root()), text_field, stdlib_root())

    def key(self) -> str:
        """A digest of every file's path, size and modification time and of the text field: the
        cache key of the tokens (reading a corpus larger than memory twice to hash it would cost
        as much as tokenizing it)."""
        digest = hashlib.sha256(self.text_field.encode())
        for path in self.files:
            stat = path.stat()
            digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode("utf-8", "surrogatepass"))
        return digest.hexdigest()[:24]

    def documents(self) -> Iterator[Document]:
        """Every document of every file, in order (``skipped`` counts this pass' skipped files)."""
        self.skipped = 0
        for path in self.files:
            yield from self.read(path)

    def read(self, path: Path) -> Iterator[Document]:
        name = path.name
        if name.endswith(JSONL_SUFFIXES):
            yield from jsonl_documents(path, self.text_field)
        elif name.endswith(".parquet"):
            yield from parquet_documents(path, self.text_field)
        else:
            try:
                text = decode(path.read_bytes())
            except OSError:  # unreadable (permissions, a broken link): skipped like binary
                text = None
            if text is None:
                self.skipped += 1
            elif text.strip():
                yield Document(str(path.relative_to(self.root)) if self.root else str(path), text)


def open_text(path: Path) -> IO[str]:
    """A JSON Lines file, decompressed by its suffix, as UTF-8 text."""
    if path.name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    if path.name.endswith(".zst"):
        try:
            import zstandard
        except ImportError:
            raise QkovError(f"{path}: reading .zst needs the zstandard package ({INSTALL})") from None
        return zstandard.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def jsonl_documents(path: Path, text_field: str) -> Iterator[Document]:
    """One document per line, named ``file:line``; an empty file or a bad line is an error."""
    empty = True
    try:
        with open_text(path) as f:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                empty = False
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as err:
                    raise QkovError(f"{path}:{number}: not JSON ({err.msg})") from None
                if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
                    raise QkovError(
                        f"{path}:{number}: no string field {text_field!r} (choose it with --text-field)"
                    )
                if record[text_field].strip():
                    yield Document(f"{path}:{number}", record[text_field])
    except (OSError, EOFError, ValueError) as err:  # a bad archive; text that is not UTF-8
        raise QkovError(f"{path}: unreadable ({err})") from None
    if empty:
        raise QkovError(f"{path}: empty file")


def parquet_documents(path: Path, text_field: str) -> Iterator[Document]:
    """One document per row of the column ``text_field``, named ``file:row`` (1-based)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise QkovError(f"{path}: reading Parquet needs the pyarrow package ({INSTALL})") from None
    try:
        table = pq.ParquetFile(path)
    except Exception as err:  # pyarrow raises its own error types for a file that is not Parquet
        raise QkovError(f"{path}: not a Parquet file ({err})") from None
    if text_field not in table.schema_arrow.names:
        raise QkovError(f"{path}: no column {text_field!r} (choose it with --text-field)")
    if table.metadata.num_rows == 0:
        raise QkovError(f"{path}: empty file")
    row = 0
    for batch in table.iter_batches(batch_size=PARQUET_ROWS, columns=[text_field]):
        for text in batch.column(0).to_pylist():
            row += 1
            if isinstance(text, str) and text.strip():
                yield Document(f"{path}:{row}", text)
