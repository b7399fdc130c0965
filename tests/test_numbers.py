"""Numbers as results.json holds them (``qkov.numbers``): a finite number as a float, an undefined one
(NaN, infinite) as None, whatever type it came in; and the standard errors over independent units that
the claims read."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from qkov.numbers import finite, weighted_mean_se, weighted_ratio_se


@pytest.mark.parametrize(
    ("x", "expected"),
    [
        (1.5, 1.5), (-0.0, 0.0), (3, 3.0), (True, 1.0), (np.float32(0.25), 0.25), (np.int64(-7), -7.0),
        (torch.tensor(0.125), 0.125), (torch.tensor(2, dtype=torch.int64), 2.0), (1e308, 1e308),
        (float("nan"), None), (float("inf"), None), (-math.inf, None), (np.float64("nan"), None),
        (torch.tensor(float("-inf")), None), (np.float32("inf"), None),
    ],
)  # fmt: skip
def test_finite_numbers_are_floats_and_undefined_ones_none(x, expected):
    got = finite(x)
    assert got == expected and (got is None or type(got) is float)


def test_a_tensor_of_more_than_one_number_is_refused_by_float():
    with pytest.raises((TypeError, ValueError, RuntimeError)):
        finite(torch.tensor([1.0, 2.0]))


def test_the_ratio_standard_error_matches_the_scatter_of_repeated_draws():
    """Over 4,000 draws of 40 units with unequal weights and correlated numerators and denominators,
    the delta method's standard error of ``sum(w a) / sum(w b)`` averages to the ratio's actual
    spread across draws (within 5%), and the weighted mean's likewise."""
    rng = np.random.default_rng(0)
    ratios, errors, means, mean_errors = [], [], [], []
    for _ in range(4000):
        w = rng.integers(5, 50, size=40).astype(float)
        b = 2.0 + rng.normal(0, 0.5, size=40)
        a = 0.3 * b + rng.normal(0, 0.4, size=40)
        ratios.append((w * a).sum() / (w * b).sum())
        errors.append(weighted_ratio_se(a, b, w))
        means.append((w * a).sum() / w.sum())
        mean_errors.append(weighted_mean_se(a, w))
    assert np.mean(errors) == pytest.approx(np.std(ratios), rel=0.05)
    assert np.mean(mean_errors) == pytest.approx(np.std(means), rel=0.05)


def test_equal_weights_give_the_textbook_standard_error_and_one_unit_none():
    values = [1.0, 2.0, 4.0, 7.0]
    assert weighted_mean_se(values, [3.0] * 4) == pytest.approx(np.std(values, ddof=1) / 2)
    assert weighted_mean_se([1.0], [1.0]) is None
    assert weighted_ratio_se([1.0, 2.0], [0.0, 0.0], [1.0, 1.0]) is None
