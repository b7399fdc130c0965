"""The one corpus pipeline of every command (``train``, ``reproduce``, ``analyze --corpus``):
documents streamed from the corpus' files (:mod:`qkov.data.sources`), a tokenizer trained on a
bounded sample of them, and the token stream written as it is produced into sharded token files in
the cache, read back a slice at a time. Peak memory does not grow with the corpus.

Documents are encoded a batch at a time with HF ``tokenizers``' batch encoder (which uses every
core) and appended, each followed by end-of-text, to the train or the eval split (the document's
name decides, as in :func:`qkov.data.tokens.is_eval_document`). A split's tokens go to disk batch
by batch, into a partial file that becomes the next shard (``train-00000.bin``: raw token ids) once
the train split's holds :data:`SHARD_TOKENS`; every shard and the manifest that records how far the
stream got are written atomically, so an interrupted tokenization resumes from its last shard, and
a bad document deletes the unfinished stream. Reads are plain file reads of one slice, never a
memory map: a training run's memory does not grow with the corpus.

The cache (:func:`qkov.data.tokens.cache_dir`) holds ``tokenizers/files-{corpus key}-{vocab}.json``
and ``shards/{corpus key}-{tokenizer fingerprint}/``, the corpus key being
:meth:`qkov.data.sources.CorpusFiles.key`: a rerun neither retrains nor re-tokenizes.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.progress import Progress, TextColumn, TimeElapsedColumn
from tokenizers import Tokenizer

from qkov.data.corpus import Document
from qkov.data.sources import TEXT_FIELD, CorpusFiles
from qkov.data.tokenizer import end_of_text_id, train_tokenizer
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
    tokenizer = train_tokenizer(sample(corpus.documents()), vocab_size)
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


def corpus_tokens(
    patterns: list[str] | None,
    tokenizer: Tokenizer,
    text_field: str = TEXT_FIELD,
    show_progress: bool = False,
) -> TokenShards:
    """The corpus named by ``patterns`` (files, folders or globs; ``None`` or ``["stdlib"]``: the
    standard library) in a given tokenizer: a checkpoint's, for ``qkov analyze --corpus``."""
    files = CorpusFiles.find(None if patterns == ["stdlib"] else patterns, text_field)
    return sharded_tokens(files, tokenizer, show_progress)


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


def token_dtype(tokenizer: Tokenizer) -> np.dtype:
    return np.dtype(np.uint16 if tokenizer.get_vocab_size() <= 2**16 else np.int32)


class ShardWriter:
    """One split's next shard, written as its tokens come: appended to a hidden partial file that
    becomes the split's next shard file, atomically, when :meth:`finish` is called. Memory holds
    one batch of tokens, never a shard."""

    def __init__(self, folder: Path, split: str, count: int) -> None:
        self.folder, self.split, self.count = folder, split, count  # count: the split's finished shards
        self.partial = folder / f".{split}.partial"
        self.tokens = 0  # in the partial shard

    def append(self, tokens: np.ndarray) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.partial, "ab" if self.tokens else "wb") as f:  # an interrupted run's is redone
            tokens.tofile(f)
        self.tokens += len(tokens)

    def finish(self) -> int:
        """The partial shard, if it holds any token, becomes the next shard; the shard count."""
        if self.tokens:
            shard = shard_files(self.folder, self.split, self.count + 1)[-1]
            atomic_write(shard, lambda tmp: os.replace(self.partial, tmp))
            self.count, self.tokens = self.count + 1, 0
        return self.count


def encode_batch(tokenizer: Tokenizer, batch: list[Document], dtype: np.dtype) -> dict[str, np.ndarray]:
    """Each split's tokens of a batch of documents, in order, each document followed by end-of-text."""
    eot = [end_of_text_id(tokenizer)]
    parts: dict[str, list[np.ndarray]] = {s: [] for s in SPLITS}
    for doc, enc in zip(batch, tokenizer.encode_batch_fast([d.text for d in batch]), strict=True):
        parts["eval" if is_eval_document(doc.path) else "train"].append(np.asarray(enc.ids + eot, dtype))
    return {split: np.concatenate(arrays) for split, arrays in parts.items() if arrays}


def write_shards(
    corpus: CorpusFiles, tokenizer: Tokenizer, folder: Path, manifest: dict, show_progress: bool
) -> dict:
    """Tokenize the documents the manifest has not covered; returns the completed manifest."""
    dtype = token_dtype(tokenizer)
    manifest = manifest or {"documents": 0, "train": 0, "eval": 0, "dtype": dtype.name}
    writers = {split: ShardWriter(folder, split, manifest[split]) for split in SPLITS}
    done = manifest["documents"]

    def finish_shards() -> None:
        manifest.update({split: writer.finish() for split, writer in writers.items()}, documents=done)
        atomic_write_text(folder / MANIFEST, json.dumps(manifest) + "\n")

    columns = (
        TextColumn("tokenizing: {task.fields[docs]:,} documents, {task.completed:,.0f} MB"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, TimeElapsedColumn(), disable=not show_progress, transient=True) as progress:
        task = progress.add_task("tokenize", total=None, docs=0)
        for batch in batches(corpus.documents(), skip=manifest["documents"]):
            for split, tokens in encode_batch(tokenizer, batch, dtype).items():
                writers[split].append(tokens)
            done += len(batch)
            progress.update(task, advance=sum(len(d.text) for d in batch) / 2**20, docs=done)
            if writers["train"].tokens >= SHARD_TOKENS:
                finish_shards()
    if done == 0:
        raise QkovError(
            f"corpus: no text in {len(corpus.files)} file(s) ({corpus.skipped} binary or undecodable)"
        )
    finish_shards()
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
    stream (at least one token, at most the last shard's all but one) becomes the eval split."""
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
