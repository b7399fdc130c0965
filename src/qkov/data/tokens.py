"""Token arrays and random training windows: the cache's location, the train/eval rule, and the
windows a training step or an analysis reads.

A held-out split of whole documents (about 2%, chosen by each document's name) gives an eval loss.
Token arrays are read only through ``len()`` and contiguous slices, so an in-memory array
(:class:`TokenSplits`) and the sharded tokens of a corpus larger than memory
(:class:`qkov.data.shards.TokenShards`) serve alike.
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

from qkov.errors import QkovError

EVAL_PERCENT = 2


def cache_dir() -> Path:
    """The cache of trained tokenizers and token shards: ``$QKOV_CACHE``, else ``~/.cache/qkov``."""
    return Path(os.environ.get("QKOV_CACHE") or Path.home() / ".cache" / "qkov")


@dataclass(frozen=True)
class TokenSplits:
    """Token ids of the training and held-out documents in memory, each document followed by
    end-of-text (given by a user, or by a test)."""

    train: np.ndarray
    eval: np.ndarray


def is_eval_document(path: str) -> bool:
    return zlib.crc32(path.encode("utf-8", "surrogatepass")) % 100 < EVAL_PERCENT


def tokenizer_fingerprint(tokenizer: Tokenizer) -> str:
    return hashlib.sha256(tokenizer.to_str().encode()).hexdigest()[:16]


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
