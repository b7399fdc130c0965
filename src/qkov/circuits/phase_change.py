"""The induction phase change, read off a checkpoint's training log (``metrics.jsonl``: one JSON row
per evaluation) the way "In-context Learning and Induction Heads" (Olsson et al. 2022, the
follow-up to the framework paper's section "Two-Layer Attention-Only Transformers") identifies it:
by signatures that occur together in one window of training, and that a one-layer model lacks.

The rule, fixed before any run was judged by it, works in ``x = log10(tokens)``, the axis
the papers plot; a signal is read at the logged evaluations and linearly interpolated in ``x``.

- A signal's *change* over ``[a, b]`` is ``(s(b) - s(a)) / (s_final - s_first)``: the fraction of its
  whole change (first logged value to last) made in between. A rising induction score and a falling
  (more negative) in-context-learning score both give positive fractions.
- The *window* of the 2-layer run runs from the best induction score's first passage of
  ``RISE_START`` of its rise to its first passage of ``RISE_END``.
- Signatures inside the window: ``induction_score`` (the window is at most ``MAX_WINDOW_DECADES``
  wide), ``icl_score`` (the in-context-learning score makes at least ``MOST_OF_CHANGE`` of its change
  inside it) and ``loss_bump`` (the training loss's slope in log tokens is steeper somewhere inside
  than at both ends: the bump in the loss curve). A log without training losses (a checkpoint
  series measures held-out losses only) is read by its held-out loss, ``eval_loss``: the same curve
  for a run that sees each token once, as the papers' runs do.
- The 1-layer control: the narrowest interval over which the 1-layer run's in-context-learning
  score makes ``MOST_OF_CHANGE`` of its change; it "shows no such window" when that interval is
  wider than ``MAX_WINDOW_DECADES`` (or the score never moves, or the log has none).
- The phase change holds when all three signatures fall inside the window and the control shows none.

The log is read as :class:`qkov.training_log.TrainingPoint` rows, so a log written by another
program in the same format is judged the same way; fields it did not log are ``None`` (an old log
has no ``icl_score``: the ``icl_score`` signature is then absent).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from qkov.training_log import TrainingPoint

# The widest published phase-change window, in decades of training tokens, so that a phase change
# as wide as a published one still counts: a public reanalysis of Neel Nanda's attention-only
# checkpoints (about 22B tokens) shades it at about 3e8-1.5e9 tokens, log10(1.5e9 / 3e8) = 0.7
# decades. Olsson et al. 2022's window is narrower: "between seeing
# 2.5 and 5 billion tokens in one analyzed model", log10(5 / 2.5) = 0.3 decades (as a secondary
# write-up of the paper quotes it; the stored copy of the paper's page did not reach that passage).
MAX_WINDOW_DECADES = 0.7
# "During this phase change, the majority of in-context learning ability (as measured by difference
# in loss between tokens early and late in the sequence) is acquired" (Olsson et al. 2022).
MOST_OF_CHANGE = 0.5
# The window's ends: first passage of 10% and of 90% of the best induction score's rise.
RISE_START, RISE_END = 0.1, 0.9
# The loss slope is taken between evaluations at least this far apart (decades): under half the
# trainer's log spacing (10 a decade; rounded to whole steps 0.08-0.12 apart from step 10), so every
# log-spaced evaluation counts and an ``eval_every`` one that lands 0.001-0.003 decades from a
# log-spaced one (steps 1995 and 2000) does not. Over such a pair the slope is the loss's noise over
# 0.003 decades: with those pairs the bump test found a dip in all 15 runs of the phase-change sweep
# (docs/experiments.md), without them 13.
MIN_SLOPE_SPACING = 0.04
SIGNATURES = ("induction_score", "icl_score", "loss_bump")


# -- a signal along log tokens ---------------------------------------------------------------------
def signal(log: list[TrainingPoint], field: str) -> tuple[np.ndarray, np.ndarray]:
    """``(x, s)``: ``x = log10(tokens)`` of the evaluations that logged ``field`` as a finite number
    (rows at zero tokens have no place on a log axis; of rows at the same tokens the last counts), in
    token order."""
    values = {row.tokens: getattr(row, field) for row in log if row.tokens > 0}
    kept = sorted((t, v) for t, v in values.items() if v is not None and math.isfinite(v))
    return np.log10([t for t, _ in kept]), np.array([v for _, v in kept], dtype=float)


def progress(s: np.ndarray) -> np.ndarray | None:
    """The signal as the fraction of its whole change made so far: 0 at the first value, 1 at the
    last; None when it has fewer than two values or does not move."""
    if len(s) < 2 or s[-1] == s[0]:
        return None
    return (s - s[0]) / (s[-1] - s[0])


def _reach(x: np.ndarray, u: np.ndarray, i: int, target: float) -> float | None:
    """The first ``x`` after knot ``i`` where ``u`` (linear between knots) reaches ``target`` from
    below; ``u[i] < target``. None when it never does."""
    for j in range(i, len(x) - 1):
        if u[j + 1] >= target:  # u[j] < target, so the segment rises through it
            return float(x[j] + (target - u[j]) / (u[j + 1] - u[j]) * (x[j + 1] - x[j]))
    return None


def narrowest_window(x: np.ndarray, u: np.ndarray, fraction: float) -> tuple[float, float] | None:
    """The narrowest ``[a, b]`` with ``u(b) - u(a) >= fraction``, ``u`` linear between knots: the
    width is piecewise linear in either end, so one end of the narrowest sits on a knot. Ends on a
    knot ``a``: the first reach of ``u(a) + fraction`` after it; ends on a knot ``b``: the same search
    run backwards (``x`` and ``u`` negated and reversed)."""
    best = None
    for sign in (1, -1):
        xs, us = (x, u) if sign == 1 else (-x[::-1], -u[::-1])
        for i in range(len(xs) - 1):
            end = _reach(xs, us, i, us[i] + fraction)
            if end is not None and (best is None or end - xs[i] < best[1] - best[0]):
                best = (float(xs[i]), end) if sign == 1 else (-end, float(-xs[i]))
    return best


def spaced(x: np.ndarray, s: np.ndarray, spacing: float) -> tuple[np.ndarray, np.ndarray]:
    """The knots at least ``spacing`` after the last one kept, from the first (``x`` ascending)."""
    keep = [0] if len(x) else []
    for i in range(1, len(x)):
        if x[i] - x[keep[-1]] >= spacing:
            keep.append(i)
    return x[keep], s[keep]


def slope_loss(log: list[TrainingPoint]) -> str:
    """The loss whose slope shows the bump: ``train_loss``, or ``eval_loss`` when no row logged one."""
    return "train_loss" if any(row.train_loss is not None for row in log) else "eval_loss"


def loss_slope(log: list[TrainingPoint]) -> list[tuple[float, float]]:
    """``(tokens, slope)``: the loss's slope in log tokens, ``d loss / d log10(tokens)`` of the
    :func:`slope_loss`, between consecutive evaluations at least ``MIN_SLOPE_SPACING`` decades apart
    (:func:`spaced`), as the 3-point running mean of those slopes; placed at the geometric middle
    of the evaluations of the middle slope."""
    x, loss = spaced(*signal(log, slope_loss(log)), MIN_SLOPE_SPACING)
    if len(x) < 4:  # three slopes for one running mean
        return []
    slopes, middles = np.diff(loss) / np.diff(x), (x[1:] + x[:-1]) / 2
    smooth = np.convolve(slopes, np.ones(3) / 3, mode="valid")
    return [(float(10**m), float(v)) for m, v in zip(middles[1:-1], smooth, strict=True)]


def has_bump(slope: list[tuple[float, float]], a: float, b: float) -> bool:
    """Whether the slope inside ``(a, b)`` (log tokens) gets lower (steeper descent) than at both
    ends, the ends read by linear interpolation."""
    if not slope:
        return False
    x = np.log10([t for t, _ in slope])
    v = np.array([s for _, s in slope])
    inside = v[(x > a) & (x < b)]
    return len(inside) > 0 and float(inside.min()) < min(np.interp([a, b], x, v))


# -- the 1-layer control and the phase change ------------------------------------------------------
@dataclass(frozen=True)
class ControlWindow:
    """The 1-layer control: the narrowest interval over which the in-context-learning score makes
    ``MOST_OF_CHANGE`` of its change (``None`` when the score never moves or was not logged), and
    whether that interval is a phase-change window (``found``: at most ``MAX_WINDOW_DECADES``)."""

    narrowest_start_tokens: float | None
    narrowest_end_tokens: float | None
    narrowest_decades: float | None
    found: bool


def control_window(log: list[TrainingPoint]) -> ControlWindow:
    x, s = signal(log, "icl_score")
    u = progress(s)
    window = narrowest_window(x, u, MOST_OF_CHANGE) if u is not None else None
    if window is None:
        return ControlWindow(None, None, None, False)
    a, b = window
    return ControlWindow(10**a, 10**b, b - a, b - a <= MAX_WINDOW_DECADES)


@dataclass(frozen=True)
class PhaseChange:
    """The phase change of a training run by the module's rule: the window (where the best induction
    score passed 10% and 90% of its rise; ``window_decades = log10(end / start)``), the
    ``signatures`` inside it (of ``induction_score``, ``icl_score``, ``loss_bump``), the fraction of
    the in-context-learning score's change made inside it (``icl_change``), the loss's slope in log
    tokens (``loss_slope``, for the bump; of the field ``slope_of``), and the 1-layer ``control``
    (``None`` when no 1-layer log was given: ``qkov analyze`` reads one checkpoint). ``holds``
    needs all three signatures and a control that shows no window: it is ``False`` when a signature
    is missing, and ``None`` (undecided) when all three are there but no control was given."""

    window_start_tokens: float
    window_end_tokens: float
    window_decades: float
    signatures: list[str]
    holds: bool | None
    initial_induction: float
    final_induction: float
    initial_icl: float | None
    final_icl: float | None
    icl_change: float | None
    loss_slope: list[tuple[float, float]]
    control: ControlWindow | None
    slope_of: str = "train_loss"


def _icl_change(
    log: list[TrainingPoint], a: float, b: float
) -> tuple[float | None, float | None, float | None]:
    """The in-context-learning score's first and last values, and the fraction of its change made
    over ``[a, b]`` (log tokens); ``None`` where it was not logged or never moves."""
    x, s = signal(log, "icl_score")
    u = progress(s)
    if u is None:
        return (float(s[0]), float(s[-1]), None) if len(s) else (None, None, None)
    change = np.interp([a, b], x, u)
    return float(s[0]), float(s[-1]), float(change[1] - change[0])


def _verdict(signatures: list[str], control: ControlWindow | None) -> bool | None:
    if len(signatures) < len(SIGNATURES):
        return False
    return None if control is None else not control.found


def phase_change(
    two_layer_log: list[TrainingPoint], one_layer_log: list[TrainingPoint] | None = None
) -> PhaseChange | None:
    """The phase change of a (2-layer) training log, with the 1-layer log's control when given;
    None without induction scores or without a rise."""
    x, s = signal(two_layer_log, "induction_score")
    u = progress(s)
    if u is None or s[-1] < s[0]:
        return None
    a, b = _reach(x, u, 0, RISE_START), _reach(x, u, 0, RISE_END)
    assert a is not None and b is not None, "the last value is the whole rise"
    initial_icl, final_icl, icl_change = _icl_change(two_layer_log, a, b)
    slope = loss_slope(two_layer_log)
    inside = {
        "induction_score": b - a <= MAX_WINDOW_DECADES,
        "icl_score": icl_change is not None and icl_change >= MOST_OF_CHANGE,
        "loss_bump": has_bump(slope, a, b),
    }
    signatures = [name for name in SIGNATURES if inside[name]]
    control = control_window(one_layer_log) if one_layer_log is not None else None
    return PhaseChange(
        window_start_tokens=10**a,
        window_end_tokens=10**b,
        window_decades=b - a,
        signatures=signatures,
        holds=_verdict(signatures, control),
        initial_induction=float(s[0]),
        final_induction=float(s[-1]),
        initial_icl=initial_icl,
        final_icl=final_icl,
        icl_change=icl_change,
        loss_slope=slope,
        control=control,
        slope_of=slope_loss(two_layer_log),
    )
