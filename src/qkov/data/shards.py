"""Corpora larger than memory: a tokenizer trained on a bounded sample, and the token stream written
as it is produced into sharded token files in the cache, read back a window at a time.

Documents are encoded a batch at a time with HF ``tokenizers``' batch encoder (which uses every
core) and appended, each followed by end-of-text, to the train or the eval split (the document's
name decides, as in :func:`qkov.data.tokens.is_eval_document`). A split's tokens go to disk as a
shard (``train-00000.bin``: raw token ids) once it holds :data:`SHARD_TOKENS`; every shard and the
manifest that records how far the stream got are written atomically, so an interrupted
tokenization resumes from its last shard, and a bad document deletes the unfinished stream. Reads
are plain file reads of one window, never a memory map: a training run's memory does not grow
with the corpus.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.progress import Progress, TextColumn, TimeElapsedColumn
from tokenizers import Tokenizer

from qkov.data.corpus import Document
from qkov.data.sources import CorpusFiles
from qkov.data.tokenizer import end_of_text_id, train_tokenizer_on
from qkov.data.tokens import EVAL_PERCENT, cache_dir, is_eval_document, tokenizer_fingerprint
from qkov.errors import QkovError
from qkov.io import atomic_write, atomic_write_text

SAMPLE_BYTES = 256 * 2**20  # the tokenizer's training sample (the whole standard library is ~40 MiB)
SHARD_TOKENS = 2**24  # 32 MiB of uint16 ids per shard
BATCH_BYTES = 2 * 2**20  # text encoded per call of the batch encoder
MANIFEST = "manifest.json"
SPLITS = ("train", "eval")


class ShardedTokens:
    """The token ids of one split, spread over shard files; ``len()`` and slices (``tokens[a:b]``,
    which may span shards) are all a training run needs."""

    def __init__(self, files: list[Path], dtype: np.dtype) -> None:
        self.files, self.dtype = files, np.dtype(dtype)
        lengths = [f.stat().st_size // self.dtype.itemsize for f in files]
        self.starts = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, index: slice) -> np.ndarray:
        start, stop, step = index.indices(len(self))
        if step != 1:
            raise QkovError("sharded tokens are read in contiguous slices only")
        parts = []
        shard = int(np.searchsorted(self.starts, start, side="right")) - 1
        while start < stop:
            end = min(stop, int(self.starts[shard + 1]))
            offset = (start - int(self.starts[shard])) * self.dtype.itemsize
            parts.append(np.fromfile(self.files[shard], self.dtype, end - start, offset=offset))
            start, shard = end, shard + 1
        return np.concatenate(parts) if parts else np.empty(0, self.dtype)


def sample(documents: Iterator[Document], limit: int = SAMPLE_BYTES) -> Iterator[str]:
    """The texts of the first documents, up to ``limit`` bytes of UTF-8 in all."""
    taken = 0
    for doc in documents:
        if taken >= limit:
            return
        taken += len(doc.text.encode("utf-8", "surrogatepass"))
        yield doc.text


def sampled_tokenizer(corpus: CorpusFiles, vocab_size: int) -> Tokenizer:
    """Byte-level BPE trained on the corpus' first :data:`SAMPLE_BYTES`, cached by the corpus' key."""
    file = cache_dir() / "tokenizers" / f"files-{corpus.key()}-{vocab_size}.json"
    if file.is_file():
        return Tokenizer.from_file(str(file))
    tokenizer = train_tokenizer_on(sample(corpus.documents()), vocab_size)
    atomic_write_text(file, tokenizer.to_str())
    return tokenizer


@dataclass(frozen=True)
class TokenShards:
    """Both splits of a tokenized corpus (the :class:`qkov.data.tokens.TokenSplits` interface)."""

    train: ShardedTokens
    eval: ShardedTokens


def sharded_tokens(corpus: CorpusFiles, tokenizer: Tokenizer, show_progress: bool = True) -> TokenShards:
    """The corpus tokenized into shards in the cache: read if complete, else (re)started or resumed."""
    folder = cache_dir() / "shards" / f"{corpus.key()}-{tokenizer_fingerprint(tokenizer)}"
    manifest = read_manifest(folder)
    if not manifest.get("complete"):
        try:
            manifest = write_shards(corpus, tokenizer, folder, manifest, show_progress)
        except QkovError:
            shutil.rmtree(folder, ignore_errors=True)  # a bad corpus is fixed, not resumed
            raise
    dtype = np.dtype(manifest["dtype"])
    return TokenShards(*(ShardedTokens(shard_files(folder, s, manifest[s]), dtype) for s in SPLITS))


def read_manifest(folder: Path) -> dict:
    file = folder / MANIFEST
    if not file.is_file():
        return {}
    try:
        return json.loads(file.read_text())
    except ValueError:
        raise QkovError(f"token cache {folder}: unreadable manifest; delete the folder to rebuild") from None


def shard_files(folder: Path, split: str, count: int) -> list[Path]:
    return [folder / f"{split}-{i:05d}.bin" for i in range(count)]


def write_shards(
    corpus: CorpusFiles, tokenizer: Tokenizer, folder: Path, manifest: dict, show_progress: bool
) -> dict:
    """Tokenize the documents the manifest has not covered; returns the completed manifest."""
    dtype = np.uint16 if tokenizer.get_vocab_size() <= 2**16 else np.int32
    manifest = manifest or {"documents": 0, "train": 0, "eval": 0, "dtype": np.dtype(dtype).name}
    eot = np.array([end_of_text_id(tokenizer)], dtype=dtype)
    buffers: dict[str, list[np.ndarray]] = {s: [] for s in SPLITS}
    done = manifest["documents"]

    def flush() -> None:
        for split in SPLITS:
            if buffers[split]:
                tokens = np.concatenate(buffers[split])
                file = shard_files(folder, split, manifest[split] + 1)[-1]
                atomic_write(file, lambda tmp, t=tokens: t.tofile(tmp))
                manifest[split] += 1
                buffers[split] = []
        manifest["documents"] = done
        atomic_write_text(folder / MANIFEST, json.dumps(manifest) + "\n")

    columns = (
        TextColumn("tokenizing: {task.fields[docs]:,} documents, {task.completed:,.0f} MB"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, TimeElapsedColumn(), disable=not show_progress, transient=True) as progress:
        task = progress.add_task("tokenize", total=None, docs=0)
        for batch in batches(corpus.documents(), skip=manifest["documents"]):
            encodings = tokenizer.encode_batch([d.text for d in batch])
            for doc, enc in zip(batch, encodings, strict=True):
                split = "eval" if is_eval_document(doc.path) else "train"
                buffers[split] += [np.asarray(enc.ids, dtype=dtype), eot]
            done += len(batch)
            progress.update(task, advance=sum(len(d.text) for d in batch) / 2**20, docs=done)
            if sum(len(b) for b in buffers["train"]) >= SHARD_TOKENS:
                flush()
    if done == 0:
        raise QkovError(
            f"corpus: no text in {len(corpus.files)} file(s) ({corpus.skipped} binary or undecodable)"
        )
    flush()
    if not manifest["train"] or not manifest["eval"]:
        hold_out_the_tail(folder, manifest)
    manifest["complete"] = True
    atomic_write_text(folder / MANIFEST, json.dumps(manifest) + "\n")
    return manifest


def batches(documents: Iterator[Document], skip: int) -> Iterator[list[Document]]:
    """Documents after the first ``skip``, in lists of about :data:`BATCH_BYTES` of text."""
    batch: list[Document] = []
    size = 0
    for index, doc in enumerate(documents):
        if index < skip:
            continue
        batch.append(doc)
        size += len(doc.text)
        if size >= BATCH_BYTES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def hold_out_the_tail(folder: Path, manifest: dict) -> None:
    """A corpus whose documents all fell in one split (one or a few files): the last 2% of the token
    stream (at least one token) becomes the eval split, as :func:`qkov.data.tokens.tokenize` does."""
    if not manifest["train"]:  # every document was an eval document: they become the stream
        for i, file in enumerate(shard_files(folder, "eval", manifest["eval"])):
            file.replace(folder / f"train-{i:05d}.bin")
        manifest["train"], manifest["eval"] = manifest["eval"], 0
    files = shard_files(folder, "train", manifest["train"])
    total = len(ShardedTokens(files, np.dtype(manifest["dtype"])))
    tokens = np.fromfile(files[-1], manifest["dtype"])
    held = min(len(tokens) - 1, max(1, total * EVAL_PERCENT // 100))
    if held < 1:
        raise QkovError("corpus: too few tokens to hold any out for evaluation")
    atomic_write(folder / "eval-00000.bin", lambda tmp: tokens[-held:].tofile(tmp))
    atomic_write(files[-1], lambda tmp: tokens[:-held].tofile(tmp))
    manifest["eval"] = 1
