"""Token arrays and training windows (``qkov.data.tokens``): the cache's place, the held-out rule, and
random windows of consecutive tokens drawn the same from the same seed."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch

import qkov
from qkov.data.tokens import (
    EVAL_PERCENT,
    cache_dir,
    is_eval_document,
    sample_windows,
    window_starts,
    windows_at,
)


def test_windows_are_deterministic_and_contiguous():
    tokens = np.arange(1000, dtype=np.uint16)
    a = sample_windows(tokens, 4, 17, torch.Generator().manual_seed(3))
    b = sample_windows(tokens, 4, 17, torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and a.shape == (4, 17) and a.dtype == torch.int64
    assert torch.all(a[:, 1:] - a[:, :-1] == 1)
    with pytest.raises(qkov.QkovError, match="fewer than one window"):
        sample_windows(tokens[:10], 1, 17, torch.Generator())


def test_window_starts_are_torchs_draws_in_every_offset():
    starts = window_starts(20, 500, 17, torch.Generator().manual_seed(3))
    expected = torch.randint(0, 4, (500,), generator=torch.Generator().manual_seed(3)).tolist()
    assert starts == expected and set(starts) == {0, 1, 2, 3}  # offsets 0..20-17, the last included
    assert window_starts(17, 2, 17, torch.Generator()) == [0, 0]  # exactly one window


def test_windows_at_are_the_tokens_at_each_offset():
    tokens = np.array([5, 6, 7, 8, 9], dtype=np.uint16)
    windows = windows_at(tokens, [0, 2, 1], 3)
    assert windows.dtype == torch.int64 and windows.tolist() == [[5, 6, 7], [7, 8, 9], [6, 7, 8]]


def test_the_cache_is_qkov_cache_else_the_users(monkeypatch, tmp_path):
    monkeypatch.setenv("QKOV_CACHE", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c"
    monkeypatch.delenv("QKOV_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_dir() == tmp_path / ".cache" / "qkov"


def test_a_document_is_held_out_by_its_names_checksum():
    names = [f"module_{i}.py" for i in range(2000)]
    held = [n for n in names if is_eval_document(n)]
    assert held == [n for n in names if zlib.crc32(n.encode()) % 100 < EVAL_PERCENT]
    assert 0.01 < len(held) / len(names) < 0.03  # about 2%
    assert is_eval_document("caf\udce9.py") in (True, False)  # a name that is not UTF-8 still has one
