"""Finding a corpus (``qkov.data.corpus``): the standard library by default, paths, folders and globs
expanded sorted and deduplicated, a missing one in one line, and text told from binary."""

from __future__ import annotations

import pytest

import qkov
from qkov.data.corpus import decode, expand, stdlib_files, stdlib_root
from qkov.data.sources import CorpusFiles


def test_default_corpus_is_the_standard_library_without_third_party_packages():
    files = stdlib_files(stdlib_root())
    names = {str(f.relative_to(stdlib_root())) for f in files}
    assert "os.py" in names and "asyncio/base_events.py" in names
    assert not any("site-packages" in n for n in names)
    assert files == sorted(files)


def test_missing_corpus_path_is_a_clear_error(tmp_path):
    with pytest.raises(qkov.QkovError, match="does not exist"):
        CorpusFiles.find([str(tmp_path / "nope.txt")])
    with pytest.raises(qkov.QkovError, match="matches no file"):
        CorpusFiles.find([str(tmp_path / "*.nope")])


def test_folders_files_and_globs_expand_to_sorted_distinct_files(tiny_corpus):
    (tiny_corpus / "deep" / "er").mkdir(parents=True)
    (tiny_corpus / "deep" / "er" / "z.txt").write_text("z")
    patterns = [str(tiny_corpus / name) for name in ("module_1*.py", "module_10.py", "deep")]
    assert [p.relative_to(tiny_corpus).as_posix() for p in expand(patterns)] == [
        "deep/er/z.txt", "module_1.py", "module_10.py", "module_11.py"
    ]  # fmt: skip
    assert len(expand([str(tiny_corpus)])) == 13  # a folder is searched recursively
    assert [p.name for p in expand([str(tiny_corpus / "**" / "*.txt")])] == ["z.txt"]
    with pytest.raises(qkov.QkovError, match=r"^corpus: '.*\*\.nope' matches no file$"):
        expand([str(tiny_corpus / "*.nope")])


@pytest.mark.parametrize(
    ("data", "text"),
    [
        (b"def f():\n", "def f():\n"),
        ("caf\u00e9 \u2603".encode(), "caf\u00e9 \u2603"),
        (b"", ""),
        (b"text\x00more", None),  # a NUL byte: binary
        ("caf\xe9".encode("latin-1"), None),  # not UTF-8
    ],
)
def test_decode_is_utf8_text_or_none(data, text):
    assert decode(data) == text
