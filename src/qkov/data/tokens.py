"""Tokenized corpora, cached as memory-mapped arrays, and random training windows.

The cache (``$QKOV_CACHE``, else ``~/.cache/qkov``) holds the trained tokenizer, keyed by the corpus'
fingerprint and the vocabulary size, and the token arrays, keyed by the corpus' and the tokenizer's
fingerprints, so a rerun neither retrains nor re-tokenizes. A held-out split of whole documents
(about 2%) gives an eval loss.
"""

from __future__ import annotations

import hashlib
import os
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from qkov.data.corpus import Corpus
from qkov.data.tokenizer import end_of_text_id, train_tokenizer
from qkov.errors import QkovError
from qkov.io import atomic_write, atomic_write_text

EVAL_PERCENT = 2


def cache_dir() -> Path:
    return Path(os.environ.get("QKOV_CACHE") or Path.home() / ".cache" / "qkov")


def cached_tokenizer(corpus: Corpus, vocab_size: int) -> Tokenizer:
    """The BPE tokenizer of ``corpus`` at ``vocab_size``, trained once and then read from the cache."""
    file = cache_dir() / "tokenizers" / f"{corpus.fingerprint()}-{vocab_size}.json"
    if file.is_file():
        return Tokenizer.from_file(str(file))
    tokenizer = train_tokenizer(corpus, vocab_size)
    atomic_write_text(file, tokenizer.to_str())
    return tokenizer


@dataclass(frozen=True)
class TokenSplits:
    """Token ids of the training and held-out documents, each document followed by end-of-text."""

    train: np.ndarray
    eval: np.ndarray


def is_eval_document(path: str) -> bool:
    return zlib.crc32(path.encode("utf-8", "surrogatepass")) % 100 < EVAL_PERCENT


def tokenize(corpus: Corpus, tokenizer: Tokenizer) -> TokenSplits:
    """Encode every document and split the documents into train and eval.

    If either split would be empty (a corpus of one or a few files), the token stream itself is
    split: its last 2% (at least one token) is held out.
    """
    eot = end_of_text_id(tokenizer)
    dtype = np.uint16 if tokenizer.get_vocab_size() <= 2**16 else np.int32
    encodings = tokenizer.encode_batch([d.text for d in corpus.documents])
    parts: dict[bool, list[np.ndarray]] = {True: [], False: []}
    for doc, enc in zip(corpus.documents, encodings, strict=True):
        parts[is_eval_document(doc.path)].append(np.asarray(enc.ids + [eot], dtype=dtype))
    if parts[True] and parts[False]:
        return TokenSplits(np.concatenate(parts[False]), np.concatenate(parts[True]))
    stream = np.concatenate(parts[True] + parts[False])
    cut = len(stream) - max(1, len(stream) * EVAL_PERCENT // 100)
    return TokenSplits(stream[:cut], stream[cut:])


def tokenizer_fingerprint(tokenizer: Tokenizer) -> str:
    return hashlib.sha256(tokenizer.to_str().encode()).hexdigest()[:16]


def save_array(path: Path, array: np.ndarray) -> None:
    with open(path, "wb") as f:
        np.save(f, array)


def cached_tokens(corpus: Corpus, tokenizer: Tokenizer) -> TokenSplits:
    """:func:`tokenize`, memory-mapped from the cache after the first call."""
    stem = cache_dir() / "tokens" / f"{corpus.fingerprint()}-{tokenizer_fingerprint(tokenizer)}"
    files = {split: stem.with_name(f"{stem.name}.{split}.npy") for split in ("train", "eval")}
    if not all(f.is_file() for f in files.values()):
        splits = tokenize(corpus, tokenizer)
        for split, file in files.items():
            array = getattr(splits, split)
            atomic_write(file, lambda tmp, a=array: save_array(tmp, a))
    try:
        return TokenSplits(*(np.load(files[s], mmap_mode="r") for s in ("train", "eval")))
    except (ValueError, OSError) as err:
        raise QkovError(f"token cache {stem}: unreadable ({err}); delete it to rebuild") from None


def window_starts(n_tokens: int, batch_size: int, length: int, generator: torch.Generator) -> list[int]:
    """The offsets of ``batch_size`` windows of ``length`` tokens, uniformly random in a split of
    ``n_tokens``: drawn for the whole global batch, so that every process draws the same ones."""
    if n_tokens < length:
        raise QkovError(f"corpus split has {n_tokens} tokens, fewer than one window of {length}")
    last = n_tokens - length
    return torch.randint(0, last + 1, (batch_size,), generator=generator, device=generator.device).tolist()


def windows_at(tokens: np.ndarray, starts: list[int], length: int) -> torch.Tensor:
    """The windows of ``length`` consecutive tokens at ``starts``, ``[len(starts), length]`` int64."""
    return torch.from_numpy(np.stack([np.asarray(tokens[s : s + length], dtype=np.int64) for s in starts]))


def sample_windows(
    tokens: np.ndarray, batch_size: int, length: int, generator: torch.Generator
) -> torch.Tensor:
    """``batch_size`` windows of ``length`` consecutive tokens at uniformly random offsets."""
    return windows_at(tokens, window_starts(len(tokens), batch_size, length, generator), length)
