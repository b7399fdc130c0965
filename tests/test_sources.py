"""Documents streamed from corpus files (``qkov.data.sources``): folders, files and globs, the default
corpus named relative to the standard library, every format (text, JSON Lines plain, gzip or zstd,
Parquet) giving the same documents, skipped files counted, and each bad file one line naming it."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import qkov
from qkov.data.corpus import stdlib_files, stdlib_root
from qkov.data.sources import CorpusFiles

from jsonl import write_jsonl

TEXTS = [f"def f_{i}(self, value):\n    return self.value_{i} + value * {i}\n" * 20 for i in range(30)]


def documents(patterns):
    return list(CorpusFiles.find(patterns).documents())


def test_corpus_from_folders_files_and_globs(tiny_corpus):
    by_folder = documents([str(tiny_corpus)])
    by_glob = documents([str(tiny_corpus / "module_1*.py")])
    by_file = documents([str(tiny_corpus / "module_3.py"), str(tiny_corpus / "module_3.py")])
    assert len(by_folder) == 12
    assert [d.path.rsplit("/", 1)[1] for d in by_glob] == ["module_1.py", "module_10.py", "module_11.py"]
    assert len(by_file) == 1
    key = CorpusFiles.find([str(tiny_corpus)]).key()
    assert key == CorpusFiles.find([str(tiny_corpus)]).key()
    assert key != CorpusFiles.find([str(tiny_corpus / "module_1*.py")]).key()


def test_the_key_changes_with_a_files_content_and_the_text_field(tiny_corpus):
    key = CorpusFiles.find([str(tiny_corpus)]).key()
    assert len(key) == 24 and key != CorpusFiles.find([str(tiny_corpus)], text_field="body").key()
    (tiny_corpus / "module_0.py").write_text("changed: another size\n")
    assert CorpusFiles.find([str(tiny_corpus)]).key() != key


def test_the_default_corpus_names_documents_relative_to_the_standard_library():
    corpus = CorpusFiles.find(None)
    first = next(corpus.documents())
    assert corpus.root == stdlib_root() and first.path == str(corpus.files[0].relative_to(stdlib_root()))
    assert CorpusFiles.find(None).files == stdlib_files(stdlib_root())


def test_binary_unreadable_and_undecodable_files_are_skipped_and_counted(tiny_corpus):
    (tiny_corpus / "image.png").write_bytes(b"\x89PNG\x00\x00\x01")
    (tiny_corpus / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    corpus = CorpusFiles.find([str(tiny_corpus)])
    (tiny_corpus / "module_0.py").unlink()  # gone between finding and reading: unreadable
    assert len(list(corpus.documents())) == 11 and corpus.skipped == 3


@pytest.mark.parametrize("name", ["c.jsonl", "c.jsonl.gz", "c.jsonl.zst", "c.parquet"])
def test_every_format_gives_the_same_documents(tmp_path, name):
    path = tmp_path / name
    if name.endswith(".parquet"):
        pq.write_table(pa.table({"body": TEXTS, "n": list(range(len(TEXTS)))}), path)
    else:
        write_jsonl(path, [{"body": t, "n": i} for i, t in enumerate(TEXTS)])
    docs = list(CorpusFiles.find([str(tmp_path)], text_field="body").documents())
    assert [d.text for d in docs] == TEXTS
    assert docs[2].path == f"{path}:3"


def test_blank_lines_rows_and_texts_are_no_documents(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", [{"text": "one"}, {"text": "  \n"}, {"text": "three"}])
    (tmp_path / "a.jsonl").write_text((tmp_path / "a.jsonl").read_text() + "\n\n")
    pq.write_table(pa.table({"text": ["x", None, "", "y"]}), tmp_path / "b.parquet")
    (tmp_path / "c.txt").write_text(" \n\t\n")
    docs = documents([str(tmp_path)])
    assert [(d.path.rsplit("/", 1)[1], d.text) for d in docs] == [
        ("a.jsonl:1", "one"), ("a.jsonl:3", "three"), ("b.parquet:1", "x"), ("b.parquet:4", "y")
    ]  # fmt: skip


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("a.jsonl", '{"text": "fine"}\n{"text": broken\n', r"a.jsonl:2: not JSON \(Expecting value\)$"),
        ("b.jsonl", '{"text": "fine"}\n\n{"body": "x"}\n', r"b.jsonl:3: no string field 'text' \(choose"),
        ("c.jsonl", '["text"]\n', "c.jsonl:1: no string field 'text'"),
        ("d.jsonl", "\n\n", "d.jsonl: empty file$"),
        ("e.jsonl.gz", b"not gzip at all", r"e.jsonl.gz: unreadable \("),
        ("f.jsonl", b'{"text": "caf\xe9"}\n', r"f.jsonl: unreadable \("),
        ("g.parquet", b"PAR1 but not parquet", "g.parquet: not a Parquet file"),
    ],
)
def test_a_bad_file_is_one_line_naming_it(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    with pytest.raises(qkov.QkovError, match=message) as info:
        documents([str(path)])
    assert str(info.value).startswith(str(path)) and "\n" not in str(info.value)


def test_a_parquet_file_without_the_column_or_rows_is_one_line(tmp_path):
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "a.parquet")
    with pytest.raises(qkov.QkovError, match=r"a.parquet: no column 'text' \(choose it with --text-field\)$"):
        documents([str(tmp_path / "a.parquet")])
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), tmp_path / "b.parquet")
    with pytest.raises(qkov.QkovError, match="b.parquet: empty file$"):
        documents([str(tmp_path / "b.parquet")])
