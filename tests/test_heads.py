"""Behavioural head scores on hand-built attention patterns with known answers."""

from __future__ import annotations

import pytest
import torch

from qkov.circuits.heads import duplicate_token_scores, induction_scores, previous_token_scores

from handbuilt import induction_model, pointer_arithmetic_model


def shifted(n: int, offset: int) -> torch.Tensor:
    """Attention from each dest to dest - offset (to position 0 where that does not exist)."""
    pattern = torch.zeros(n, n)
    for dest in range(n):
        pattern[dest, max(0, dest - offset)] = 1.0
    return pattern


def test_a_previous_token_head_scores_one_and_a_uniform_head_scores_low():
    n = 8
    uniform = torch.tril(torch.ones(n, n))
    uniform = uniform / uniform.sum(-1, keepdim=True)
    cache = {"blocks.0.attn.hook_pattern": torch.stack([shifted(n, 1), uniform])[None]}
    scores = previous_token_scores(cache)
    assert scores.shape == (1, 2)
    assert scores[0, 0] == 1.0
    expected_uniform = sum(1 / (dest + 1) for dest in range(1, n)) / (n - 1)
    torch.testing.assert_close(scores[0, 1], torch.tensor(expected_uniform))


def test_an_induction_head_scores_one_on_its_period():
    period, n = 5, 15
    cache = {
        "blocks.0.attn.hook_pattern": torch.stack([shifted(n, 1), shifted(n, 1)])[None],
        "blocks.1.attn.hook_pattern": torch.stack([shifted(n, period - 1), shifted(n, 1)])[None],
    }
    scores = induction_scores(cache, period)
    assert scores.shape == (2, 2)
    assert scores[1, 0] == 1.0 and scores[0, 0] == 0.0 and scores[1, 1] == 0.0


def test_a_perfect_induction_head_scores_one():
    """On a sequence with no token repeated within a period, the planted head attends exactly
    one period back, plus one: score 1.0 (TransformerLens' detect_head caps near 0.5 here)."""
    model = induction_model()
    tokens = torch.randperm(63)[:4].add(1).repeat(3)[None]  # 4 distinct tokens, three times
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    assert float(induction_scores(cache, period=4)[1, 0]) == pytest.approx(1.0, abs=1e-4)


def test_a_duplicate_token_head_scores_one_and_a_half_duplicate_half():
    """Period 4 over 12 positions: a head attending exactly one period back scores 1 (every
    destination from position 4 on), one that splits its attention between one period back and the
    previous token scores 1/2, and the induction offset (one period back, plus one) scores 0."""
    period, n = 4, 12
    half = 0.5 * shifted(n, period) + 0.5 * shifted(n, 1)
    cache = {
        "blocks.0.attn.hook_pattern": torch.stack([shifted(n, period), half, shifted(n, period - 1)])[None]
    }
    scores = duplicate_token_scores(cache, period)
    assert scores.shape == (1, 3)
    assert scores[0].tolist() == pytest.approx([1.0, 0.5, 0.0])


def test_the_hand_built_duplicate_token_head_splits_between_earlier_occurrences():
    """handbuilt.pointer_arithmetic_model's L0H0 attends to every earlier occurrence of the current
    token alike. On 4 distinct tokens repeated three times, the second repeat has one earlier
    occurrence (one period back: weight 1) and the third two (weight 1/2 each), so its
    duplicate-token score is (4 x 1 + 4 x 1/2) / 8 = 0.75; the previous-token head of
    induction_model attends one back, never one period back: 0."""
    tokens = torch.randperm(31)[:4].add(1).repeat(3)[None]
    with torch.no_grad():
        _, pointer = pointer_arithmetic_model().run_with_cache(tokens)
        _, previous = induction_model().run_with_cache(tokens)
    assert float(duplicate_token_scores(pointer, period=4)[0, 0]) == pytest.approx(0.75, abs=1e-4)
    assert float(duplicate_token_scores(previous, period=4)[0, 0]) == pytest.approx(0.0, abs=1e-4)
