"""Corpora larger than memory: JSON Lines (plain, gzip, zstd) and Parquet readers, bad input,
streaming tokenization into shards (resumable), and training memory independent of corpus size."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

import qkov
from qkov.data import shards
from qkov.data.corpus import read_corpus
from qkov.data.shards import ShardedTokens, sampled_tokenizer, sharded_tokens
from qkov.data.sources import CorpusFiles
from qkov.data.tokens import cache_dir, tokenize
from test_train import TINY, qkov_cli

TEXTS = [f"def f_{i}(self, value):\n    return self.value_{i} + value * {i}\n" * 20 for i in range(30)]


def write_jsonl(path, rows):
    data = "".join(json.dumps(row) + "\n" for row in rows).encode()
    if path.name.endswith(".gz"):
        data = gzip.compress(data)
    elif path.name.endswith(".zst"):
        data = zstandard.ZstdCompressor().compress(data)
    path.write_bytes(data)
    return path


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


def test_shards_hold_the_same_tokens_as_tokenizing_in_memory(tiny_corpus, monkeypatch):
    monkeypatch.setattr(shards, "SHARD_TOKENS", 1000)
    monkeypatch.setattr(shards, "BATCH_BYTES", 3000)
    files = CorpusFiles.find([str(tiny_corpus)])
    tokenizer = sampled_tokenizer(files, 300)
    data = sharded_tokens(files, tokenizer, show_progress=False)
    expected = tokenize(read_corpus([str(tiny_corpus)]), tokenizer)
    assert len(data.train.files) > 3
    np.testing.assert_array_equal(data.train[0 : len(data.train)], expected.train)
    np.testing.assert_array_equal(data.eval[0 : len(data.eval)], expected.eval)
    np.testing.assert_array_equal(data.train[990:2010], expected.train[990:2010])  # across shards


def test_an_interrupted_tokenization_resumes_from_its_last_shard(tiny_corpus, monkeypatch):
    monkeypatch.setattr(shards, "SHARD_TOKENS", 1000)
    monkeypatch.setattr(shards, "BATCH_BYTES", 3000)
    files = CorpusFiles.find([str(tiny_corpus)])
    tokenizer = sampled_tokenizer(files, 300)
    encoded = []
    real_batches = shards.batches

    def interrupted(documents, skip):
        for i, batch in enumerate(real_batches(documents, skip)):
            if i == 4:
                raise KeyboardInterrupt
            encoded.append(len(batch))
            yield batch

    monkeypatch.setattr(shards, "batches", interrupted)
    with pytest.raises(KeyboardInterrupt):
        sharded_tokens(files, tokenizer, show_progress=False)
    manifest = json.loads(next((cache_dir() / "shards").glob("*/manifest.json")).read_text())
    assert 0 < manifest["documents"] < 12 and "complete" not in manifest
    monkeypatch.setattr(shards, "batches", real_batches)
    data = sharded_tokens(files, tokenizer, show_progress=False)
    expected = tokenize(read_corpus([str(tiny_corpus)]), tokenizer)
    np.testing.assert_array_equal(data.train[0 : len(data.train)], expected.train)


def test_a_single_document_holds_out_its_tail(tmp_path):
    write_jsonl(tmp_path / "one.jsonl", [{"text": "hello world " * 200}])
    files = CorpusFiles.find([str(tmp_path / "one.jsonl")])
    data = sharded_tokens(files, sampled_tokenizer(files, 260), show_progress=False)
    assert len(data.eval) == max(1, (len(data.train) + len(data.eval)) * 2 // 100)


# The peak RSS of this process alone (VmHWM; getrusage's ru_maxrss would include pytest's, kept across exec)
PEAK_RSS = """
import sys, numpy as np, torch, qkov
from qkov.data.shards import ShardedTokens, TokenShards
from qkov.train import TrainConfig, Trainer
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
