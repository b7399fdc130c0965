"""Corpus discovery, tokenizer training, the token cache and the batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import qkov
from qkov.data import tokens as token_module
from qkov.data.corpus import read_corpus, stdlib_files, stdlib_root
from qkov.data.random_tokens import loss_per_repeat, repeated_random_tokens
from qkov.data.tokenizer import END_OF_TEXT, train_tokenizer
from qkov.data.tokens import cached_tokenizer, cached_tokens, sample_windows, tokenize


def test_default_corpus_is_the_standard_library_without_third_party_packages():
    files = stdlib_files(stdlib_root())
    names = {str(f.relative_to(stdlib_root())) for f in files}
    assert "os.py" in names and "asyncio/base_events.py" in names
    assert not any("site-packages" in n for n in names)
    assert files == sorted(files)


def test_corpus_from_folders_files_and_globs(tiny_corpus):
    by_folder = read_corpus([str(tiny_corpus)])
    by_glob = read_corpus([str(tiny_corpus / "module_1*.py")])
    by_file = read_corpus([str(tiny_corpus / "module_3.py"), str(tiny_corpus / "module_3.py")])
    assert len(by_folder.documents) == 12
    assert [d.path.rsplit("/", 1)[1] for d in by_glob.documents] == [
        "module_1.py",
        "module_10.py",
        "module_11.py",
    ]
    assert len(by_file.documents) == 1
    assert by_folder.fingerprint() == read_corpus([str(tiny_corpus)]).fingerprint()
    assert by_folder.fingerprint() != by_glob.fingerprint()


def test_binary_and_undecodable_files_are_skipped_and_counted(tiny_corpus):
    (tiny_corpus / "image.png").write_bytes(b"\x89PNG\x00\x00\x01")
    (tiny_corpus / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    corpus = read_corpus([str(tiny_corpus)])
    assert corpus.skipped == 2 and len(corpus.documents) == 12


@pytest.mark.parametrize("content", [None, b"", b"\x00\x01\x02binary", b"   \n\n"])
def test_empty_or_binary_corpus_is_a_clear_error(tmp_path, content):
    if content is not None:
        (tmp_path / "f.bin").write_bytes(content)
    with pytest.raises(qkov.QkovError, match="corpus: no text"):
        read_corpus([str(tmp_path)])


def test_missing_corpus_path_is_a_clear_error(tmp_path):
    with pytest.raises(qkov.QkovError, match="does not exist"):
        read_corpus([str(tmp_path / "nope.txt")])
    with pytest.raises(qkov.QkovError, match="matches no file"):
        read_corpus([str(tmp_path / "*.nope")])


def test_tokenizer_is_byte_level_bpe_with_end_of_text(tiny_corpus):
    corpus = read_corpus([str(tiny_corpus)])
    tokenizer = train_tokenizer(corpus, 300)
    assert tokenizer.get_vocab_size() == 300
    assert tokenizer.token_to_id(END_OF_TEXT) == 0
    text = "def f(self):\n    return 'é ☃'"
    assert tokenizer.decode(tokenizer.encode(text).ids) == text  # byte level: anything round-trips
    with pytest.raises(qkov.QkovError, match="at least 257"):
        train_tokenizer(corpus, 100)


def test_tokens_are_cached_and_split(tiny_corpus, monkeypatch):
    corpus = read_corpus([str(tiny_corpus)])
    tokenizer = cached_tokenizer(corpus, 300)
    assert cached_tokenizer(corpus, 300).to_str() == tokenizer.to_str()
    first = cached_tokens(corpus, tokenizer)
    calls = []
    monkeypatch.setattr(token_module, "tokenize", lambda *a: calls.append(a))
    second = cached_tokens(corpus, tokenizer)
    assert calls == []  # read from the cache, not tokenized again
    assert isinstance(second.train, np.memmap)
    np.testing.assert_array_equal(first.train, second.train)
    fresh = tokenize(corpus, tokenizer)
    assert len(fresh.train) + len(fresh.eval) == sum(
        len(tokenizer.encode(d.text).ids) + 1 for d in corpus.documents
    )
    assert len(fresh.eval) >= 1 and len(fresh.train) > len(fresh.eval)


def test_a_single_document_is_split_by_position(tmp_path):
    (tmp_path / "one.txt").write_text("hello world " * 200)
    corpus = read_corpus([str(tmp_path / "one.txt")])
    splits = tokenize(corpus, train_tokenizer(corpus, 260))
    assert len(splits.eval) == max(1, (len(splits.train) + len(splits.eval)) * 2 // 100)


def test_windows_are_deterministic_and_contiguous():
    tokens = np.arange(1000, dtype=np.uint16)
    a = sample_windows(tokens, 4, 17, torch.Generator().manual_seed(3))
    b = sample_windows(tokens, 4, 17, torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and a.shape == (4, 17) and a.dtype == torch.int64
    assert torch.all(a[:, 1:] - a[:, :-1] == 1)
    with pytest.raises(qkov.QkovError, match="fewer than one window"):
        sample_windows(tokens[:10], 1, 17, torch.Generator())


def test_repeated_random_tokens_repeat():
    tokens = repeated_random_tokens(3, 10, 3, 50, torch.Generator().manual_seed(0))
    assert tokens.shape == (3, 30)
    assert torch.equal(tokens[:, :10], tokens[:, 10:20]) and torch.equal(tokens[:, :10], tokens[:, 20:])
    assert tokens.min() >= 1 and tokens.max() < 50


def test_loss_per_repeat_leaves_out_each_copys_unpredictable_first_token():
    # period 4, 3 copies: 11 next-token losses; the losses at positions 3 and 7 predict the first
    # token of copies 2 and 3, which follow a pair never seen before
    losses = torch.tensor([[1.0, 1.0, 1.0, 99.0, 2.0, 2.0, 2.0, 99.0, 3.0, 3.0, 3.0]])
    assert loss_per_repeat(losses, 4) == [1.0, 2.0, 3.0]
    assert loss_per_repeat(torch.stack([losses[0], losses[0] + 1]), 4) == [1.5, 2.5, 3.5]  # batch averaged
    with pytest.raises(qkov.QkovError, match="period of at least 2"):
        loss_per_repeat(losses, 1)
