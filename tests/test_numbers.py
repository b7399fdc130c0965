"""Numbers as results.json holds them (``qkov.numbers``): a finite number as a float, an undefined one
(NaN, infinite) as None, whatever type it came in."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from qkov.numbers import finite


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
