"""The one corpus pipeline, for corpora larger than memory: bad input in any format (the readers
themselves are tests/test_sources.py) leaves no shard, the tokenizer and the tokens are cached,
streaming tokenization into shards (the tokens of encoding each document alone; resumable), the
analyses' chunked reads of shards, and training memory independent of corpus size."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import qkov
from qkov.circuits.bigrams import BigramCounts
from qkov.circuits.skip_trigrams import skip_trigram_occurs
from qkov.data import shards
from qkov.data.shards import ShardedTokens, corpus_tokens, sampled_tokenizer, sharded_tokens
from qkov.data.sources import CorpusFiles
from qkov.data.tokenizer import END_OF_TEXT
from qkov.data.tokens import cache_dir, is_eval_document
from test_train import TINY, qkov_cli

from jsonl import write_jsonl


def direct_encoding(documents, tokenizer):
    """The known answer: each document encoded alone (``Tokenizer.encode``, not the batch encoder),
    end-of-text after it, appended to the split its name picks."""
    eot = tokenizer.token_to_id(END_OF_TEXT)
    splits = {"train": [], "eval": []}
    for doc in documents:
        splits["eval" if is_eval_document(doc.path) else "train"] += tokenizer.encode(doc.text).ids + [eot]
    return {split: np.array(ids, dtype=np.uint16) for split, ids in splits.items()}


def generated_corpus(folder, lines=600):
    """A folder of every format: one .jsonl of ``lines`` documents (enough that both splits get
    some: each document's name is an eval document's with probability 2%), a .parquet and text."""
    folder.mkdir()
    rng = np.random.default_rng(0)
    words = ["def", "self", "return", "value", "(", ")", ":", "\n", "    ", "x", "é", "☃", "0x1f", "+"]
    texts = [" ".join(rng.choice(words, rng.integers(1, 40))) for _ in range(lines)]
    write_jsonl(folder / "a.jsonl", [{"text": t} for t in texts])
    pq.write_table(pa.table({"text": texts[:50]}), folder / "b.parquet")
    (folder / "c.py").write_text("def f(self):\n    return self.x\n")
    return folder


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("a.jsonl", '{"text": "fine"}\n{"text": broken\n', r"a.jsonl:2: not JSON \(Expecting value\)"),
        ("b.jsonl", '{"text": "fine"}\n\n{"body": "x"}\n', "b.jsonl:3: no string field 'text'"),
        ("c.jsonl", "", "c.jsonl: empty file"),
        ("d.jsonl.gz", b"not gzip at all", "d.jsonl.gz: unreadable"),
        ("e.parquet", None, "e.parquet: no column 'text'"),
    ],
)
def test_bad_input_is_one_clear_error_and_leaves_no_shard(tiny_corpus, name, content, message):
    tokenizer = sampled_tokenizer(CorpusFiles.find([str(tiny_corpus)]), 300)
    path = tiny_corpus / name
    if content is None:
        pq.write_table(pa.table({"body": ["x"]}), path)
    else:
        path.write_bytes(content.encode() if isinstance(content, str) else content)
    with pytest.raises(qkov.QkovError, match=message):
        sharded_tokens(CorpusFiles.find([str(tiny_corpus)]), tokenizer, show_progress=False)
    assert not list((cache_dir() / "shards").glob("*/*"))  # no shard, whole or partial


def test_bad_input_exits_2_with_one_line_and_writes_nothing(tiny_corpus, tmp_path):
    (tiny_corpus / "z.jsonl").write_text('{"text": "fine"}\n{"text": broken\n')
    out = tmp_path / "run"
    result = qkov_cli("train", "--layers", "1", "--corpus", str(tiny_corpus), *TINY, "--out", str(out))
    assert result.returncode == 2
    assert result.stderr == f"qkov: error: {tiny_corpus / 'z.jsonl'}:2: not JSON (Expecting value)\n"
    assert not out.exists()
    assert not list((cache_dir() / "shards").glob("*/*"))


@pytest.mark.parametrize("content", [None, b"", b"\x00\x01\x02binary", b"   \n\n"])
def test_empty_or_binary_corpus_is_a_clear_error(tmp_path, tiny_corpus, content):
    (tmp_path / "empty").mkdir()
    if content is not None:
        (tmp_path / "empty" / "f.bin").write_bytes(content)
    tokenizer = sampled_tokenizer(CorpusFiles.find([str(tiny_corpus)]), 300)
    with pytest.raises(qkov.QkovError, match="corpus: no text"):
        corpus_tokens([str(tmp_path / "empty")], tokenizer)


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


def test_the_pipeline_gives_each_documents_own_encoding(tmp_path, monkeypatch):
    """Known answer: shards of 1000 tokens, batches of 3000 bytes, and the tokens are those of
    encoding each document alone, in file order, a .jsonl's by its lines (its text field, not its
    JSON), split by the documents' names."""
    monkeypatch.setattr(shards, "SHARD_TOKENS", 1000)
    monkeypatch.setattr(shards, "BATCH_BYTES", 3000)
    files = CorpusFiles.find([str(generated_corpus(tmp_path / "corpus"))])
    tokenizer = sampled_tokenizer(files, 300)
    data = sharded_tokens(files, tokenizer, show_progress=False)
    expected = direct_encoding(files.documents(), tokenizer)
    assert len(expected["eval"]) and len(data.train.files) > 3
    np.testing.assert_array_equal(data.train[0 : len(data.train)], expected["train"])
    np.testing.assert_array_equal(data.eval[0 : len(data.eval)], expected["eval"])
    np.testing.assert_array_equal(data.train[990:2010], expected["train"][990:2010])  # across shards
    assert not list(data.train.files[0].parent.glob(".*"))  # no partial shard left behind


def test_analyzes_corpus_reads_a_jsonl_as_documents(tmp_path):
    """``qkov analyze --corpus x.jsonl`` (through :func:`corpus_tokens`): the text field of each
    line, in the checkpoint's tokenizer, from the same cache as training."""
    corpus = generated_corpus(tmp_path / "corpus")
    files = CorpusFiles.find([str(corpus / "a.jsonl")])
    tokenizer = sampled_tokenizer(files, 300)
    data = corpus_tokens([str(corpus / "a.jsonl")], tokenizer)
    expected = direct_encoding(files.documents(), tokenizer)
    np.testing.assert_array_equal(data.train[0 : len(data.train)], expected["train"])
    assert data.train.files == sharded_tokens(files, tokenizer, show_progress=False).train.files


def test_an_interrupted_tokenization_resumes_from_its_last_shard(tiny_corpus, tmp_path, monkeypatch):
    monkeypatch.setattr(shards, "SHARD_TOKENS", 1000)
    monkeypatch.setattr(shards, "BATCH_BYTES", 3000)
    files = CorpusFiles.find([str(tiny_corpus)])
    tokenizer = sampled_tokenizer(files, 300)
    monkeypatch.setenv("QKOV_CACHE", str(tmp_path / "uninterrupted"))
    straight = sharded_tokens(files, tokenizer, show_progress=False)
    monkeypatch.setenv("QKOV_CACHE", str(tmp_path / "interrupted"))
    real_batches = shards.batches

    def interrupted(documents, skip):
        for i, batch in enumerate(real_batches(documents, skip)):
            if i == 4:
                raise KeyboardInterrupt
            yield batch

    monkeypatch.setattr(shards, "batches", interrupted)
    with pytest.raises(KeyboardInterrupt):
        sharded_tokens(files, tokenizer, show_progress=False)
    manifest_file = next((cache_dir() / "shards").glob("*/manifest.json"))
    manifest = json.loads(manifest_file.read_text())
    assert 0 < manifest["documents"] < 12 and "complete" not in manifest
    (manifest_file.parent / ".train.partial").write_bytes(b"killed mid-write")  # a partial shard is redone
    monkeypatch.setattr(shards, "batches", real_batches)
    data = sharded_tokens(files, tokenizer, show_progress=False)
    for split in ("train", "eval"):
        ours, theirs = getattr(data, split), getattr(straight, split)
        np.testing.assert_array_equal(ours[0 : len(ours)], theirs[0 : len(theirs)])


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 1000])
def test_bigram_counts_of_shards_in_chunks_are_those_of_the_whole_array(tmp_path, chunk):
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 9, 500).astype(np.uint16)
    tokens[100:300] = rng.integers(0, 3, 200)  # some pairs far more common than others
    for i, part in enumerate(np.array_split(tokens, 4)):
        part.tofile(tmp_path / f"train-{i:05d}.bin")
    sharded = ShardedTokens(sorted(tmp_path.glob("*.bin")), np.uint16)
    ours = BigramCounts.of(sharded, 9, chunk=chunk)
    direct = tokens.astype(np.int64)
    pairs = {(a, b): int(((direct[:-1] == a) & (direct[1:] == b)).sum()) for a in range(9) for b in range(9)}
    assert {(a, b): c for a, b, c in zip(ours.current, ours.next, ours.counts, strict=True)} == {
        k: v for k, v in pairs.items() if v
    }
    assert list(zip(ours.current, ours.next, strict=True)) == sorted(k for k, v in pairs.items() if v)
    np.testing.assert_array_equal(ours.unigram, np.bincount(direct[:-1], minlength=9))
    assert ours.counts.dtype == ours.unigram.dtype == np.int64
    whole = BigramCounts.of(tokens, 9)  # one chunk: the in-memory array at once
    for name in ("current", "next", "counts", "unigram"):
        np.testing.assert_array_equal(getattr(ours, name), getattr(whole, name))


def test_bigram_counts_name_the_largest_id_outside_the_vocabulary():
    tokens = np.array([1, 2, 12, 3, 4, 15, 0], dtype=np.uint16)
    with pytest.raises(qkov.QkovError, match="corpus token id 15 is outside the model's vocabulary \\(9\\)"):
        BigramCounts.of(tokens, 9, chunk=2)
    with pytest.raises(qkov.QkovError, match="at least 2 tokens"):
        BigramCounts.of(tokens[:1], 9)


def skip_trigram_known(tokens, source, destination, out, window):
    """By definition: some position ``h`` with ``tokens[h], tokens[h + 1] == destination, out`` and
    ``source`` among ``tokens[h - window + 1 ... h]``."""
    return any(
        tokens[h] == destination and tokens[h + 1] == out and source in tokens[max(0, h - window + 1) : h + 1]
        for h in range(len(tokens) - 1)
    )


@pytest.mark.parametrize("chunk", [1, 2, 5, 64])
def test_skip_trigram_occurrences_in_chunks_are_those_of_the_whole_array(tmp_path, chunk):
    rng = np.random.default_rng(2)
    tokens = rng.integers(0, 6, 120).astype(np.uint16)
    for i, part in enumerate(np.array_split(tokens, 3)):
        part.tofile(tmp_path / f"train-{i:05d}.bin")
    sharded = ShardedTokens(sorted(tmp_path.glob("*.bin")), np.uint16)
    listed = tokens.tolist()
    answers = []
    for source, destination, out, window in itertools.product(range(6), range(6), range(6), (1, 2, 4)):
        known = skip_trigram_known(listed, source, destination, out, window)
        assert skip_trigram_occurs(sharded, source, destination, out, window, chunk=chunk) == known
        assert skip_trigram_occurs(tokens, source, destination, out, window) == known
        answers.append(known)
    assert 0 < sum(answers) < len(answers)  # both answers occur


def test_a_single_document_holds_out_its_tail(tmp_path):
    write_jsonl(tmp_path / "one.jsonl", [{"text": "hello world " * 200}])
    files = CorpusFiles.find([str(tmp_path / "one.jsonl")])
    data = sharded_tokens(files, sampled_tokenizer(files, 260), show_progress=False)
    assert len(data.eval) == max(1, (len(data.train) + len(data.eval)) * 2 // 100)


# The peak RSS of this process alone (VmHWM; getrusage's ru_maxrss would include pytest's, kept across exec)
PEAK_RSS = """
import sys, numpy as np, torch, qkov
from qkov.data.shards import ShardedTokens, TokenShards
from qkov.schedule import TrainConfig
from qkov.train import Trainer
files = sorted(__import__("pathlib").Path(sys.argv[1]).glob("*.bin"))
data = TokenShards(ShardedTokens(files, np.uint16), ShardedTokens(files[:1], np.uint16))
torch.set_num_threads(1)
cfg = qkov.Config(1, 2, 32, 16, 300, 32)
Trainer(cfg, TrainConfig(steps=100, batch_size=8, lr=1e-3), data, sys.argv[2]).run(show_progress=False)
print(next(line for line in open("/proc/self/status") if line.startswith("VmHWM")).split()[1])
"""


@pytest.mark.slow
def test_training_memory_does_not_grow_with_the_corpus(tmp_path):
    """Peak RSS of 100 steps on 2 MiB of tokens and on 256 MiB (two 128 MiB shards): the same
    within 64 MiB, a quarter of the larger corpus (measured: 355.4 and 356.1 MiB, VmHWM)."""
    peaks = {}
    for name, shard_tokens in (("small", 2**20), ("large", 2**26)):
        folder = tmp_path / name
        folder.mkdir()
        for i in range(2 if name == "large" else 1):
            (np.arange(shard_tokens) % 300).astype(np.uint16).tofile(folder / f"train-{i:05d}.bin")
        result = subprocess.run(
            [sys.executable, "-c", PEAK_RSS, str(folder), str(tmp_path / f"run-{name}")],
            capture_output=True,
            text=True,
        )
        assert result.returncode == 0, result.stderr
        peaks[name] = int(result.stdout.split()[-1]) * 1024  # VmHWM is in KiB
    assert peaks["large"] - peaks["small"] < 64 * 2**20, peaks


def test_sharded_tokens_read_contiguous_slices_only(tmp_path):
    np.arange(10, dtype=np.uint16).tofile(tmp_path / "a.bin")
    tokens = ShardedTokens([tmp_path / "a.bin"], np.uint16)
    assert tokens[3:6].tolist() == [3, 4, 5] and len(tokens) == 10
    with pytest.raises(qkov.QkovError, match="contiguous"):
        _ = tokens[::2]
