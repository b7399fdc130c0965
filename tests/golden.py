"""The inputs of the results regression test: one hand-built or seeded model per depth (and an
unfolded LayerNorm model with an MLP and biases), with a seeded token corpus and a training log, so
that every analysis step runs. ``tests/data/results_*.json`` are the ``results.json`` (schema
version 2) that ``analyze`` wrote from exactly these inputs before the circuits returned their own
typed results (commit cc98cc3); the test compares today's results with them field by field."""

from __future__ import annotations

import numpy as np
import torch

import qkov
from qkov.data.tokens import TokenSplits
from qkov.training_log import TrainingPoint

from conftest import random_model
from handbuilt import induction_model, skip_trigram_model


def corpus_tokens(d_vocab: int, seed: int) -> TokenSplits:
    rng = np.random.default_rng(seed)
    return TokenSplits(rng.integers(0, d_vocab, 6000), rng.integers(0, d_vocab, 1500))


def training_log() -> list[TrainingPoint]:
    scores = [0.0, 0.01, 0.03, 0.2, 0.35, 0.4]
    losses = {"previous_token_score": 0.5, "repeat_loss_first": 4.0, "repeat_loss_second": 3.0}
    rows = [
        {"step": 10 * (i + 1), "tokens": 1000 * (i + 1), "train_loss": 5.0 - i / 2, "eval_loss": 5.1 - i / 2}
        | {"induction_score": s}
        | losses
        for i, s in enumerate(scores)
    ]
    return [TrainingPoint(**row) for row in rows]


def cases() -> dict[str, tuple[qkov.AttnOnlyTransformer, tuple | None, list[TrainingPoint]]]:
    """``name -> (model, corpus tokens or None, training log)``."""
    torch.manual_seed(0)
    zero = random_model(qkov.Config(n_layers=0, n_heads=1, d_model=16, d_head=4, d_vocab=24, n_ctx=16))
    two = random_model(qkov.Config(n_layers=2, n_heads=2, d_model=16, d_head=8, d_vocab=24, n_ctx=18), seed=1)
    torch.manual_seed(0)
    layer_norm = qkov.Config(2, 3, 12, 4, 40, 24, normalization="LN", d_mlp=16, act_fn="gelu_new")
    rng = np.random.default_rng(3)
    layer_norm_corpus = TokenSplits(rng.integers(0, 40, 6000), rng.integers(0, 40, 1500))
    return {
        "0-layer": (zero, corpus_tokens(24, 0), []),
        "1-layer": (skip_trigram_model([(5, 3, 9), (5, 4, 10)]), corpus_tokens(16, 1), training_log()),
        "2-layer-induction": (induction_model(), None, training_log()),
        "2-layer-random": (two, corpus_tokens(24, 2), []),
        "2-layer-layernorm": (random_model(layer_norm, biases=True, seed=3), layer_norm_corpus, []),
    }
