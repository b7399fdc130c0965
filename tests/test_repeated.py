"""Behaviour on repeated random tokens (``qkov.circuits.repeated``), on models whose numbers are known:
a model of zero weights attends uniformly and predicts nothing, so its loss is ``log V`` on every
repeat and its scores are harmonic means; the hand-built induction model scores 1 where it was
built to and predicts every repeat after the first."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch

import qkov
from qkov.circuits.heads import INDUCTION_HEAD, PREVIOUS_TOKEN_HEAD
from qkov.circuits.repeated import repeated_token_behaviour
from qkov.data.random_tokens import loss_per_repeat, repeated_random_tokens
from qkov.loss import token_losses

from conftest import random_model
from handbuilt import induction_model

V, PERIOD, REPEATS = 11, 4, 3


def zero_model(bos_token_id=None) -> qkov.Transformer:
    cfg = qkov.Config(2, 2, 6, 3, V, 13, positional_embedding="standard", bos_token_id=bos_token_id)
    model = qkov.AttnOnlyTransformer(cfg).double()
    with torch.no_grad():
        for param in model.parameters():
            param.zero_()
    return model


def mean_of_inverse(first: int, last: int) -> float:
    """The mean of ``1 / k`` for ``k = first .. last``: a uniform head's attention to one source."""
    return float(sum(Fraction(1, k) for k in range(first, last + 1)) / (last - first + 1))


def test_a_uniform_model_has_loss_log_v_and_harmonic_scores():
    """Uniform attention puts ``1 / (d + 1)`` on every source of destination ``d``; over the
    12 positions, the previous-token score is the mean of that over ``d = 1 .. 11``, the induction
    and duplicate-token scores over ``d = 4 .. 11`` (the positions after the first repeat)."""
    tokens = repeated_random_tokens(5, PERIOD, REPEATS, V, torch.Generator().manual_seed(0))
    result = repeated_token_behaviour(zero_model(), tokens, PERIOD, REPEATS)
    assert result.loss_per_repeat == pytest.approx([math.log(V)] * 3, rel=1e-15)
    previous, later = mean_of_inverse(2, 12), mean_of_inverse(5, 12)
    assert [h.name for h in result.heads] == ["L0H0", "L0H1", "L1H0", "L1H1"]
    for head in result.heads:
        assert head.previous_token_score == pytest.approx(previous, rel=1e-14)
        assert head.induction_score == pytest.approx(later, rel=1e-14)
        assert head.duplicate_token_score == pytest.approx(later, rel=1e-14)
    assert previous < PREVIOUS_TOKEN_HEAD and later < INDUCTION_HEAD
    assert result.previous_token_heads == [] and result.induction_heads == []
    assert (result.period, result.repeats, result.sequences, result.bos_token_id) == (4, 3, 5, None)
    assert (result.previous_token_threshold, result.induction_threshold) == (0.5, 0.3)


def test_after_a_start_token_its_position_counts_for_nothing():
    """With a start token at position 0, destination ``d`` of the repeats (position ``d + 1``) still
    gives every source ``1 / (d + 2)``, but the start token's column and row are left out."""
    gen = torch.Generator().manual_seed(0)
    tokens = repeated_random_tokens(5, PERIOD, REPEATS, V, gen, bos_token_id=0)
    result = repeated_token_behaviour(zero_model(bos_token_id=0), tokens, PERIOD, REPEATS, bos_token_id=0)
    assert tokens.shape == (5, 13) and result.bos_token_id == 0
    assert result.loss_per_repeat == pytest.approx([math.log(V)] * 3, rel=1e-15)
    for head in result.heads:
        assert head.previous_token_score == pytest.approx(mean_of_inverse(3, 13), rel=1e-14)
        assert head.induction_score == pytest.approx(mean_of_inverse(6, 13), rel=1e-14)


def test_the_hand_built_induction_model_scores_where_it_was_built_to():
    """Distinct tokens in each period, so that the only earlier occurrence is the planted one: the
    previous-token head attends one back with weight 1, the induction head to the token after the
    earlier occurrence (within ``e^-12``, the margin of its recency preference); the first repeat
    is predicted wrong by about the induction head's logit of 20 plus the direct path's 1, and the
    later ones are predicted to float rounding."""
    tokens = torch.arange(1, PERIOD + 1).repeat(REPEATS)[None]
    result = repeated_token_behaviour(induction_model().double(), tokens, PERIOD, REPEATS)
    heads = {h.name: h for h in result.heads}
    assert heads["L0H0"].previous_token_score == pytest.approx(1.0, abs=1e-12)
    assert heads["L0H0"].induction_score == pytest.approx(0.0, abs=1e-12)
    assert heads["L1H0"].induction_score == pytest.approx(1.0, abs=1e-5)
    assert heads["L1H0"].previous_token_score == pytest.approx(0.0, abs=1e-5)
    first, second, third = result.loss_per_repeat
    assert first == pytest.approx(21.0, abs=0.05) and second < 1e-6 and third < 1e-6
    assert result.previous_token_heads == ["L0H0"] and result.induction_heads == ["L1H0"]


def test_the_standard_errors_are_the_sequences_spread():
    """Each score's and the repeat drop's standard error: the per-sequence values (each sequence run
    alone) over the square root of their number; none for a single sequence."""
    torch.manual_seed(0)
    model = qkov.AttnOnlyTransformer(qkov.Config(2, 2, 8, 4, V, 13)).double()
    tokens = repeated_random_tokens(6, PERIOD, REPEATS, V, torch.Generator().manual_seed(1))
    result = repeated_token_behaviour(model, tokens, PERIOD, REPEATS)
    alone = [repeated_token_behaviour(model, row[None], PERIOD, REPEATS) for row in tokens]
    for i, head in enumerate(result.heads):
        for field in ("previous_token_score", "induction_score"):
            each = torch.tensor([getattr(r.heads[i], field) for r in alone], dtype=torch.float64)
            assert getattr(head, f"{field}_se") == pytest.approx(float(each.std() / 6**0.5), rel=1e-9)
    drops = torch.tensor([r.loss_per_repeat[0] - r.loss_per_repeat[1] for r in alone], dtype=torch.float64)
    assert result.repeat_drop_se == pytest.approx(float(drops.std() / 6**0.5), rel=1e-6)
    assert all(r.repeat_drop_se is None and r.heads[0].previous_token_score_se is None for r in alone)


@pytest.mark.parametrize("bos_token_id", [None, 0])
def test_the_loss_per_repeat_is_the_models_own_from_its_logits(bos_token_id):
    """The losses, read off the final stream a block at a time, are those of the model's own logits
    (LayerNorm, biases, a start token or none), in float64."""
    cfg = qkov.Config(2, 2, 8, 4, V, 14, normalization="LN", bos_token_id=bos_token_id)
    model = random_model(cfg, biases=True).double()
    tokens = repeated_random_tokens(5, PERIOD, REPEATS, V, torch.Generator().manual_seed(2), bos_token_id)
    start = int(bos_token_id is not None)
    result = repeated_token_behaviour(model, tokens, PERIOD, REPEATS, bos_token_id)
    with torch.no_grad():
        losses = token_losses(model(tokens)[:, start:-1], tokens[:, start + 1 :])
    assert result.loss_per_repeat == pytest.approx(loss_per_repeat(losses, PERIOD), rel=1e-12)
    drops = torch.tensor(
        [r[0] - r[1] for r in (loss_per_repeat(row, PERIOD) for row in losses)], dtype=torch.float64
    )
    assert result.repeat_drop_se == pytest.approx(float(drops.std() / 5**0.5), rel=1e-9)
