"""The in-context-learning score's held-out windows (``qkov.evaluation``): overlapping blocks in which
each window's late prediction is the next window's early one, and a standard error over the blocks
that matches the score's actual spread over draws of windows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import qkov
from qkov.evaluation import evaluation_inputs, held_out_metrics, icl_positions, overlapping_windows

from conftest import random_model

CFG = qkov.Config(n_layers=1, n_heads=2, d_model=32, d_head=16, d_vocab=50, n_ctx=64)


def markov_text(n_tokens: int, seed: int = 0) -> np.ndarray:
    """Text with a skewed bigram structure, so that some tokens are much easier than others."""
    rng = np.random.default_rng(seed)
    table = rng.dirichlet(np.full(CFG.d_vocab, 0.1), size=CFG.d_vocab)
    text = [0]
    for _ in range(n_tokens - 1):
        text.append(int(rng.choice(CFG.d_vocab, p=table[text[-1]])))
    return np.array(text, dtype=np.uint16)


def test_each_window_predicts_at_its_late_position_what_the_next_predicts_at_its_early_one():
    text = np.arange(5000, dtype=np.int64)  # every token its own offset
    windows, block = overlapping_windows(CFG, text, 64, torch.Generator().manual_seed(0))
    early, late = icl_positions(CFG.n_ctx)
    assert block == 8 and windows.shape == (64, 65)
    blocks = windows.reshape(-1, block, 65)
    # position p predicts token p + 1: window k's late target is window k + 1's early target
    assert torch.equal(blocks[:, :-1, late + 1], blocks[:, 1:, early + 1])
    assert torch.equal(blocks[:, 1:, 0] - blocks[:, :-1, 0], torch.full((8, 7), late - early))
    assert torch.equal(windows[:, 1:] - windows[:, :-1], torch.ones(64, 64, dtype=torch.int64))


def test_short_splits_and_contexts_fall_back_to_smaller_blocks():
    assert icl_positions(CFG.n_ctx) == (3, 31)  # windows 28 tokens apart
    text = np.arange(65 + 2 * 28 + 27, dtype=np.int64)  # room for 3 windows, not 4
    assert overlapping_windows(CFG, text, 64, torch.Generator())[1] == 3
    assert overlapping_windows(CFG, np.arange(65), 64, torch.Generator())[1] == 1
    assert overlapping_windows(CFG, text, 3, torch.Generator())[1] == 1  # too few windows for two blocks
    tiny = qkov.Config(n_layers=1, n_heads=1, d_model=8, d_head=8, d_vocab=50, n_ctx=1)
    assert overlapping_windows(tiny, text, 64, torch.Generator())[1] == 1  # no ICL positions apart


@pytest.mark.parametrize("n_layers", [0, 1])
def test_the_standard_error_over_blocks_matches_the_scores_spread_over_draws(n_layers):
    """Over 150 draws of held-out windows from the same text, the logged standard error averages to
    the score's actual spread (within 20%, the sampling error of 150 draws' SD plus the blocks'),
    for overlapping blocks and for independent windows alike. With no attention (0 layers) a
    prediction depends on its token and the one before alone, so the paired predictions are equal
    and only each block's ends remain: the blocks' error is far below the independent windows'."""
    torch.manual_seed(0)
    model = random_model(qkov.Config(**{**CFG.to_dict(), "n_layers": n_layers})).double()
    text = markov_text(60_000)
    found = {}
    for block in (8, 1):
        scores, errors = [], []
        for seed in range(150):
            inputs = evaluation_inputs(CFG, text, n_tokens=65 * 48, seed=seed, block=block)
            with torch.no_grad():
                row = held_out_metrics(model, inputs.windows, inputs.block)
            scores.append(row["icl_score"]), errors.append(row["icl_score_se"])
        found[block] = float(np.std(scores)), float(np.mean(errors))
        assert found[block][1] == pytest.approx(found[block][0], rel=0.2)
    if n_layers == 0:
        assert found[8][1] < 0.5 * found[1][1]
