"""The induction phase change, read off a checkpoint's training log (``metrics.jsonl``: one JSON row
per evaluation) the way "In-context Learning and Induction Heads" (Olsson et al. 2022, the
follow-up to the framework paper's section "Two-Layer Attention-Only Transformers") identifies it:
by signatures that occur together in one window of training, and that a one-layer model lacks.

The rule works in ``x = log10(tokens)``, the axis the papers plot; a signal is read at the logged
evaluations and linearly interpolated in ``x``. Every test on the in-context-learning (ICL) score
is made against that score's noise, and answers one of three words (:mod:`qkov.numbers`): "holds",
"does not hold", or "undetermined" when the figure sits within its error of the threshold.

- The *window* of the 2-layer run runs from the best induction score's first passage of
  ``RISE_START`` of its rise to its first passage of ``RISE_END``.
- The ICL score's *noise* (:func:`noise`) is the evaluation-to-evaluation scatter of the logged
  series about its own local trend: each evaluation against the straight line through its two
  neighbours, a robust standard deviation (1.4826 x the median absolute deviation). The trainer
  scores the same held-out windows at every evaluation, so what limits a change *within* a run is
  this scatter, not the windows' sampling error (``icl_score_se``, logged beside the score, which
  bears on the score's absolute value). A value at a point is read off a straight line fitted to
  the evaluations within ``LOCAL_DECADES`` of it (:func:`local_value`), with the standard error
  that noise gives it.
- Signatures of the 2-layer run:

  - ``induction_score``: the window is at most ``MAX_WINDOW_DECADES`` wide;
  - ``icl_score``: the ICL *gain* inside the window (``s(a) - s(b)``, nats: the score falls as the
    model learns in context) is at least ``MOST_OF_CHANGE`` of its gain over the whole run (first
    evaluation to last): the margin ``gain_window - MOST_OF_CHANGE * gain_total`` against its
    standard error;
  - ``loss_bump``: the training loss's slope in log tokens is steeper somewhere inside than at
    both ends (the bump in the loss curve); read without an error. A log without training losses
    (a checkpoint series) is read by its held-out loss, ``eval_loss``.

- The 1-layer *control* test, on an absolute scale: over the same interval ``[a, b]`` the
  control's ICL gain must be below ``CONTROL_SHARE`` of the 2-layer run's gain: the margin
  ``CONTROL_SHARE * gain_2 - gain_1`` against ``sqrt(se_1^2 + CONTROL_SHARE^2 se_2^2)``. A control
  whose log does not span the window cannot be read there: undetermined.
- A test "holds" when its margin is above ``Z_HOLDS`` (1.645) standard errors, "does not hold" when
  it is below ``-Z_FAILS`` (2.326), else undetermined; the phase change holds when every signature
  and the control hold, does not hold when any of them does not, and is undetermined otherwise
  (without a control, too: ``qkov analyze`` reads one checkpoint). The error rates this gives on
  synthetic logs at the trainer's noise are measured in ``tests/test_phase_change.py`` and stated in
  ``docs/claims.md``.

The log is read as :class:`qkov.training_log.TrainingPoint` rows, so a log written by another
program in the same format is judged the same way; fields it did not log are ``None`` (an old log
has no ``icl_score``: the ``icl_score`` signature is then absent).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from qkov.numbers import FAILS, HOLDS, UNDETERMINED, all_of, decide
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
# "a one-layer model has no such window": over the 2-layer window the control gains less than this
# share of the 2-layer run's in-context-learning gain (half: the majority of the change is specific
# to the model with induction heads).
CONTROL_SHARE = 0.5
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


# -- the in-context-learning score's noise and gains -------------------------------------------------
ROBUST_SD = 1.4826  # the median absolute deviation of a Gaussian, times this, is its standard deviation


def noise(x: np.ndarray, s: np.ndarray) -> float | None:
    """The evaluation-to-evaluation scatter of a logged series (see the module docstring): every
    inner evaluation against the straight line through its neighbours, the residual divided by its
    standard deviation under white noise of unit size (``sqrt(1 + w^2 + (1 - w)^2)``), and
    ``ROBUST_SD`` times the median absolute residual; None with fewer than three evaluations."""
    if len(x) < 3:
        return None
    w = (x[2:] - x[1:-1]) / (x[2:] - x[:-2])  # the left neighbour's weight at the middle point
    residual = s[1:-1] - (w * s[:-2] + (1 - w) * s[2:])
    return float(ROBUST_SD * np.median(np.abs(residual / np.sqrt(1 + w**2 + (1 - w) ** 2))))


LOCAL_DECADES = 0.1  # a value is read off a straight line fitted to the evaluations this close


def local_value(x: np.ndarray, s: np.ndarray, at: float) -> tuple[float, float]:
    """The series' value at ``at`` and its standard error in units of the series' noise: a least-
    squares line through the evaluations within ``LOCAL_DECADES`` of it (so that several noisy
    evaluations, not one, set each end of a gain), or, with fewer than two of them, linear
    interpolation between the neighbours."""
    near = np.abs(x - at) <= LOCAL_DECADES
    if near.sum() >= 2 and np.ptp(x[near]) > 0:
        xn, sn = x[near], s[near]
        centre, sxx = xn.mean(), ((xn - xn.mean()) ** 2).sum()
        slope = ((xn - centre) * (sn - sn.mean())).sum() / sxx
        return float(sn.mean() + slope * (at - centre)), math.sqrt(1 / len(xn) + (at - centre) ** 2 / sxx)
    j = int(np.clip(np.searchsorted(x, at), 1, len(x) - 1))
    w = (x[j] - at) / (x[j] - x[j - 1])
    return float(w * s[j - 1] + (1 - w) * s[j]), math.sqrt(w**2 + (1 - w) ** 2)


@dataclass(frozen=True)
class Gain:
    """How much a run's in-context-learning score fell (nats; positive: it learned in context) over
    ``[a, b]`` in log tokens, each end read by :func:`local_value`, with its standard error from the
    series' :func:`noise`; ``None`` where the log does not span ``[a, b]``."""

    gain: float | None
    error: float | None
    noise: float | None


def gain(log: list[TrainingPoint], a: float, b: float) -> Gain:
    x, s = signal(log, "icl_score")
    sigma = noise(x, s)
    if sigma is None or x[0] > a + 1e-9 or x[-1] < b - 1e-9:
        return Gain(None, None, sigma)
    (before, ea), (after, eb) = local_value(x, s, a), local_value(x, s, b)
    return Gain(float(before - after), sigma * math.hypot(ea, eb), sigma)


# -- the 1-layer control and the phase change ------------------------------------------------------
@dataclass(frozen=True)
class ControlTest:
    """The 1-layer control over the 2-layer window: the tokens its log spans, its
    in-context-learning gain over the window (``gain``, ``gain_error``: None when the log does not
    span the window), the ``margin`` ``CONTROL_SHARE * two-layer gain - control gain`` and its
    ``margin_error``, and the ``verdict`` on "the control shows no such change" (``holds``: it gains
    less than ``CONTROL_SHARE`` of what the 2-layer run gains; ``does not hold``: it gains as much)."""

    first_tokens: float | None
    last_tokens: float | None
    gain: float | None
    gain_error: float | None
    margin: float | None
    margin_error: float | None
    verdict: str


def control_test(log: list[TrainingPoint], a: float, b: float, two: Gain) -> ControlTest:
    x, _ = signal(log, "icl_score")
    first, last = (float(10 ** x[0]), float(10 ** x[-1])) if len(x) else (None, None)
    one = gain(log, a, b)
    if one.gain is None or two.gain is None:
        return ControlTest(first, last, one.gain, one.error, None, None, UNDETERMINED)
    margin = CONTROL_SHARE * two.gain - one.gain
    error = math.hypot(one.error or 0.0, CONTROL_SHARE * (two.error or 0.0))
    return ControlTest(first, last, one.gain, one.error, margin, error, decide(margin, error))


@dataclass(frozen=True)
class PhaseChange:
    """The phase change of a training run by the module's rule: the window (where the best induction
    score passed 10% and 90% of its rise; ``window_decades = log10(end / start)``), each signature's
    verdict (``verdicts``: of ``induction_score``, ``icl_score``, ``loss_bump``; ``signatures`` lists
    those that hold), the in-context-learning score's gain inside the window and over the run with
    their standard errors and its ``icl_noise``, the fraction of its change made inside the window
    (``icl_change``), the loss's slope in log tokens (``loss_slope``, for the bump; of the field
    ``slope_of``), and the 1-layer ``control`` (``None`` when no 1-layer log was given: ``qkov
    analyze`` reads one checkpoint). ``verdict`` is "holds", "does not hold" or "undetermined";
    ``holds`` says the same as True, False or None."""

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
    control: ControlTest | None
    slope_of: str = "train_loss"
    verdict: str = UNDETERMINED
    verdicts: dict[str, str] | None = None
    icl_noise: float | None = None
    icl_gain: float | None = None
    icl_gain_error: float | None = None
    icl_total_gain: float | None = None


def _icl(log: list[TrainingPoint], a: float, b: float) -> tuple[Gain, Gain, str, float | None]:
    """The in-context-learning gain inside ``[a, b]`` and over the whole run, the ``icl_score``
    signature's verdict, and the fraction of the change made inside."""
    x, s = signal(log, "icl_score")
    if len(x) < 3:
        return Gain(None, None, None), Gain(None, None, None), UNDETERMINED, None  # not logged
    inside, total = gain(log, a, b), gain(log, float(x[0]), float(x[-1]))
    assert inside.gain is not None and total.gain is not None
    margin = inside.gain - MOST_OF_CHANGE * total.gain
    error = math.hypot(inside.error or 0.0, MOST_OF_CHANGE * (total.error or 0.0))
    fraction = inside.gain / total.gain if total.gain != 0 else None
    return inside, total, decide(margin, error), fraction


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
    inside, total, icl_verdict, fraction = _icl(two_layer_log, a, b)
    slope = loss_slope(two_layer_log)
    verdicts = {
        "induction_score": HOLDS if b - a <= MAX_WINDOW_DECADES else FAILS,
        "icl_score": icl_verdict,
        "loss_bump": HOLDS if has_bump(slope, a, b) else FAILS,
    }
    control = control_test(one_layer_log, a, b, inside) if one_layer_log is not None else None
    verdict = all_of(*verdicts.values(), control.verdict if control else UNDETERMINED)
    _, icl = signal(two_layer_log, "icl_score")
    return PhaseChange(
        window_start_tokens=10**a,
        window_end_tokens=10**b,
        window_decades=b - a,
        signatures=[name for name in SIGNATURES if verdicts[name] == HOLDS],
        holds={HOLDS: True, FAILS: False}.get(verdict),
        initial_induction=float(s[0]),
        final_induction=float(s[-1]),
        initial_icl=float(icl[0]) if len(icl) else None,
        final_icl=float(icl[-1]) if len(icl) else None,
        icl_change=fraction,
        loss_slope=slope,
        control=control,
        slope_of=slope_loss(two_layer_log),
        verdict=verdict,
        verdicts=verdicts,
        icl_noise=inside.noise,
        icl_gain=inside.gain,
        icl_gain_error=inside.error,
        icl_total_gain=total.gain,
    )


# -- in words ---------------------------------------------------------------------------------------
def _tokens(n: float | None) -> str:
    if n is None:
        return "?"
    return f"{n / 1e6:.3g}M" if n >= 1e6 else f"{n / 1e3:.3g}k"


def _pm(value: float | None, error: float | None) -> str:
    if value is None:
        return "not measured"
    return f"{value:+.3f}" + ("" if error is None else f" ± {error:.3f}")


def describe(change: PhaseChange) -> str:
    """The window, every test with its figure, error and verdict, in one line (the claims table, the
    report and ``qkov series`` print it)."""
    v = change.verdicts or {}
    icl = (
        "ICL score not logged"
        if change.icl_gain is None
        else f"ICL gain inside {_pm(change.icl_gain, change.icl_gain_error)} nats of "
        f"{_pm(change.icl_total_gain, None)} over the run ({v.get('icl_score')})"
    )
    c = change.control
    if c is None:
        control = "1-layer control: none in these results (one checkpoint alone; qkov reproduce trains one)"
    elif c.gain is None:
        control = (
            f"1-layer control: its log spans {_tokens(c.first_tokens)}-{_tokens(c.last_tokens)} tokens, not "
            f"the window ({c.verdict})"
        )
    else:
        control = (
            f"1-layer control gain over the window {_pm(c.gain, c.gain_error)} nats, margin "
            f"{_pm(c.margin, c.margin_error)} ({c.verdict})"
        )
    return (
        f"window {_tokens(change.window_start_tokens)}-{_tokens(change.window_end_tokens)} tokens, "
        f"{change.window_decades:.2f} decades ({v.get('induction_score')}; best induction score "
        f"{change.initial_induction:.2f} to {change.final_induction:.2f}); {icl}; "
        f"bump: {v.get('loss_bump')}; "
        f"{control}"
        + ("" if change.icl_noise is None else f"; ICL noise {change.icl_noise:.3f} nats an evaluation")
    )
