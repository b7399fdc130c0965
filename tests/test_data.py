"""Corpus discovery, tokenizer training, the token cache and the batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import qkov
from qkov.data import shards
from qkov.data.corpus import stdlib_files, stdlib_root
from qkov.data.random_tokens import loss_per_repeat, repeated_random_tokens
from qkov.data.shards import corpus_tokens, sampled_tokenizer, sharded_tokens
from qkov.data.sources import CorpusFiles
from qkov.data.tokenizer import END_OF_TEXT, train_tokenizer
from qkov.data.tokens import cache_dir, sample_windows


def test_default_corpus_is_the_standard_library_without_third_party_packages():
    files = stdlib_files(stdlib_root())
    names = {str(f.relative_to(stdlib_root())) for f in files}
    assert "os.py" in names and "asyncio/base_events.py" in names
    assert not any("site-packages" in n for n in names)
    assert files == sorted(files)


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


@pytest.mark.parametrize("content", [None, b"", b"\x00\x01\x02binary", b"   \n\n"])
def test_empty_or_binary_corpus_is_a_clear_error(tmp_path, tiny_corpus, content):
    (tmp_path / "empty").mkdir()
    if content is not None:
        (tmp_path / "empty" / "f.bin").write_bytes(content)
    tokenizer = sampled_tokenizer(CorpusFiles.find([str(tiny_corpus)]), 300)
    with pytest.raises(qkov.QkovError, match="corpus: no text"):
        corpus_tokens([str(tmp_path / "empty")], tokenizer)


def test_missing_corpus_path_is_a_clear_error(tmp_path):
    with pytest.raises(qkov.QkovError, match="does not exist"):
        CorpusFiles.find([str(tmp_path / "nope.txt")])
    with pytest.raises(qkov.QkovError, match="matches no file"):
        CorpusFiles.find([str(tmp_path / "*.nope")])


def test_tokenizer_is_byte_level_bpe_with_end_of_text(tiny_corpus):
    texts = [d.text for d in documents([str(tiny_corpus)])]
    tokenizer = train_tokenizer(texts, 300)
    assert tokenizer.get_vocab_size() == 300
    assert tokenizer.token_to_id(END_OF_TEXT) == 0
    text = "def f(self):\n    return 'é ☃'"
    assert tokenizer.decode(tokenizer.encode(text).ids) == text  # byte level: anything round-trips
    with pytest.raises(qkov.QkovError, match="at least 257"):
        train_tokenizer(texts, 100)


def test_the_tokenizer_and_the_tokens_are_cached(tiny_corpus, monkeypatch):
    corpus = CorpusFiles.find([str(tiny_corpus)])
    tokenizer = sampled_tokenizer(corpus, 300)
    assert [f.name for f in (cache_dir() / "tokenizers").iterdir()] == [f"files-{corpus.key()}-300.json"]
    first = sharded_tokens(corpus, tokenizer, show_progress=False)
    monkeypatch.setattr(shards, "train_tokenizer", lambda *a: pytest.fail("trained again"))
    monkeypatch.setattr(shards, "write_shards", lambda *a: pytest.fail("tokenized again"))
    assert sampled_tokenizer(corpus, 300).to_str() == tokenizer.to_str()
    second = corpus_tokens([str(tiny_corpus)], tokenizer)
    np.testing.assert_array_equal(first.train[0 : len(first.train)], second.train[0 : len(second.train)])
    assert len(first.train) + len(first.eval) == sum(
        len(tokenizer.encode(d.text).ids) + 1 for d in corpus.documents()
    )
    assert len(first.eval) >= 1 and len(first.train) > len(first.eval)


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
