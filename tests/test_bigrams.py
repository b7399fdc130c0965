"""The direct path against a corpus' bigram statistics."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import qkov
from qkov.circuits.bigrams import BigramCounts, compare_bigrams


def direct_path_model(W_U: torch.Tensor) -> qkov.AttnOnlyTransformer:
    """A zero-layer model whose direct path is ``W_U`` itself (``W_E`` the identity)."""
    V = W_U.shape[0]
    cfg = qkov.Config(
        n_layers=0, n_heads=1, d_model=V, d_head=1, d_vocab=V, n_ctx=4, positional_embedding="none"
    )
    model = qkov.AttnOnlyTransformer(cfg)
    with torch.no_grad():
        model.W_E.copy_(torch.eye(V))
        model.W_U.copy_(W_U)
    return model


def test_a_perfect_bigram_table_has_zero_kl_and_full_correlation():
    V = 6
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, V, 5000)
    counts = BigramCounts.of(tokens, V)
    table = np.zeros((V, V))
    table[counts.current, counts.next] = counts.counts
    log_p = np.log(table / table.sum(1, keepdims=True))
    result = compare_bigrams(direct_path_model(torch.from_numpy(log_p).float()), counts)
    assert result.kl == pytest.approx(0.0, abs=1e-6)
    assert result.correlation == pytest.approx(1.0, abs=1e-6)
    assert result.corpus_entropy == pytest.approx(math.log(V), abs=0.01)
    top = result.examples[0]
    assert [t for t, _ in top.corpus] == [t for t, _ in top.model]


def test_a_direct_path_that_predicts_every_token_alike_has_no_correlation():
    """A constant direct path (``W_U = 0``: every next token at ``1 / V``) has a KL of exactly
    ``log V`` minus the corpus' entropy and no correlation (None in results.json, not NaN)."""
    V = 6
    tokens = np.random.default_rng(0).integers(0, V, 5000)
    counts = BigramCounts.of(tokens, V)
    result = compare_bigrams(direct_path_model(torch.zeros(V, V)), counts)
    assert result.correlation is None
    assert result.kl == pytest.approx(math.log(V) - result.corpus_entropy, abs=1e-9)
