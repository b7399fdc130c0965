"""Numbers as ``results.json`` holds them. JSON has no NaN: a number that is undefined (a head
whose OV circuit is zero has no copying score) is ``None`` in a result and ``null`` in the file."""

from __future__ import annotations

import math
from collections.abc import Sequence


def finite(x: float) -> float | None:
    """An undefined number (NaN, infinite) as ``None``, the JSON-safe form."""
    x = float(x)
    return x if math.isfinite(x) else None


# -- three-valued verdicts ------------------------------------------------------------------------
#: A rule's answer: its figure clears the threshold by more than its error, falls short of it by
#: more than its error, or sits within its error of it.
HOLDS, FAILS, UNDETERMINED = "holds", "does not hold", "undetermined"
VERDICTS = (HOLDS, FAILS, UNDETERMINED)
Z_HOLDS = 1.645  # one-sided 5%: "holds" when the figure clears its threshold by this many errors
Z_FAILS = 2.326  # one-sided 1%: "does not hold" when it misses by this many (kept small per test, so
# that a rule reading two or three noisy tests says "does not hold" by chance at most ~3%)


def decide(margin: float, error: float | None, z_holds: float = Z_HOLDS, z_fails: float = Z_FAILS) -> str:
    """The verdict on ``margin`` (the figure minus its threshold, signed so that positive means the
    rule is met) with standard error ``error``: :data:`HOLDS` above ``z_holds`` errors,
    :data:`FAILS` below ``-z_fails`` errors, else :data:`UNDETERMINED`. An ``error`` of None or 0 (a
    figure that is exact, or whose error is not measured) decides by the sign alone."""
    if not math.isfinite(margin):
        return UNDETERMINED
    e = error or 0.0
    if margin > z_holds * e and margin > 0:
        return HOLDS
    if margin < -z_fails * e and margin < 0:
        return FAILS
    return UNDETERMINED


def all_of(*verdicts: str) -> str:
    """Every part must hold (Kleene's three-valued "and"): one part that fails fails the whole, one
    undetermined part with none failing leaves it undetermined."""
    if FAILS in verdicts:
        return FAILS
    return UNDETERMINED if UNDETERMINED in verdicts else HOLDS


def z_interval(figure: float, error: float | None, z: float = 1.96) -> tuple[float, float] | None:
    """``figure ± z * error`` (95% by default), or None without an error."""
    return None if error is None else (figure - z * error, figure + z * error)


# -- standard errors over independent units (sequences, windows) ------------------------------------
def weighted_mean_se(values: Sequence[float], weights: Sequence[float]) -> float | None:
    """The standard error of the weighted mean ``sum(w v) / sum(w)`` over independent units (e.g.
    each sequence's mean loss, weighted by its scored tokens): the ratio estimator's linearization
    ``sqrt(n / (n - 1) * sum(w_i^2 (v_i - mean)^2)) / sum(w)``; None with fewer than two units."""
    return weighted_ratio_se(values, [1.0] * len(values), weights)


def weighted_ratio_se(
    numerator: Sequence[float], denominator: Sequence[float], weights: Sequence[float]
) -> float | None:
    """The standard error of ``R = sum(w a) / sum(w b)`` over independent units ``i`` with values
    ``a_i``, ``b_i`` and weights ``w_i`` (the delta method: ``R``'s linearization is
    ``sum(w_i (a_i - R b_i)) / sum(w b)``, whose variance is estimated from the units' scatter,
    ``sqrt(n / (n - 1) * sum(w_i^2 (a_i - R b_i)^2)) / |sum(w b)|``); None with fewer than two
    units or a zero denominator."""
    n = len(weights)
    below = sum(w * b for w, b in zip(weights, denominator, strict=True))
    if n < 2 or below == 0:
        return None
    ratio = sum(w * a for w, a in zip(weights, numerator, strict=True)) / below
    spread = sum((w * (a - ratio * b)) ** 2 for w, a, b in zip(weights, numerator, denominator, strict=True))
    return math.sqrt(n / (n - 1) * spread) / abs(below)
