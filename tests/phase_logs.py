"""Synthetic training logs whose phase change is known in advance: scores that rise along a logistic
of known width in log tokens, and a one-layer control whose in-context-learning score changes
linearly over three decades. Used by the phase-change, claims and report tests."""

from __future__ import annotations

import math

import numpy as np

from qkov.training_log import TrainingPoint

GRID = np.round(np.arange(4.0, 9.0001, 0.05), 2)  # log10(tokens): 20 evaluations a decade


def logistic(x: np.ndarray, centre: float, width: float) -> np.ndarray:
    """A rise from 0 to 1 whose 10%-90% part spans ``width`` decades around ``centre``."""
    return 1 / (1 + np.exp(-(x - centre) * 2 * math.log(9) / width))


def log_of(**signals: np.ndarray) -> list[TrainingPoint]:
    """One row per point of GRID, with the given fields."""
    return [
        TrainingPoint(step=i, tokens=round(10**x), **{k: float(v[i]) for k, v in signals.items()})
        for i, x in enumerate(GRID)
    ]


def two_layer(width: float = 0.4, bump: float = 1.0) -> list[TrainingPoint]:
    """Induction and ICL scores that change together around 10^7 tokens, and a training loss that
    falls ever more slowly (0.3 nats a decade at first) plus ``bump`` nats during the change."""
    rise = logistic(GRID, 7.0, width)
    return log_of(
        induction_score=0.02 + 0.5 * rise,
        icl_score=-0.1 - 1.5 * rise,
        train_loss=7 - 0.3 * GRID + 0.02 * (GRID - 4) ** 2 - bump * rise,
    )


ONE_LAYER_LINEAR = log_of(icl_score=-0.5 * np.clip((GRID - 4.5) / 3, 0, 1))  # over 3 decades


def with_positions(log: list[TrainingPoint], n_ctx: int = 16) -> list[TrainingPoint]:
    """The rows with a loss at every token index that falls along the context by the row's ICL score."""
    return [
        TrainingPoint(
            **{**vars(row), "loss_by_position": [5 + row.icl_score * p / (n_ctx - 1) for p in range(n_ctx)]}
        )
        for row in log
    ]


# -- noisy logs on the evaluation grid of `qkov reproduce`'s 2-layer recipe (its 1-layer control
# -- follows the same schedule), for the phase-change rule's error rates ------------------------------
def reproduce_grid() -> np.ndarray:
    """log10(tokens) of every evaluation the default 2-layer recipe logs (38: log-spaced and every
    2000 steps, 10k to 14.3M tokens)."""
    from qkov.recipes import recipe

    r = recipe(2)
    per_step = r.train.batch_size * r.model.n_ctx
    return np.log10([s * per_step for s in sorted(r.train.evaluation_steps())])


WINDOW_CENTRE, WINDOW_WIDTH = math.log10(8.4e6), 0.2  # the default seeds' windows: 6.6M-10.7M tokens


def noisy_log(
    x: np.ndarray,
    rng: np.random.Generator,
    icl: np.ndarray,
    noise: float,
    induction_width: float = WINDOW_WIDTH,
) -> list[TrainingPoint]:
    """One run's log on ``x``: the best induction score rising 0.01 to 0.38 around ``WINDOW_CENTRE``
    over ``induction_width`` decades, a training loss falling ever more slowly with a 0.15-nat bump
    during the rise (both with 0.005 nats of noise), and the ICL score ``icl`` with Gaussian
    noise of ``noise`` nats an evaluation."""
    rise = logistic(x, WINDOW_CENTRE, induction_width)
    fields = {
        "induction_score": 0.01 + 0.37 * rise + rng.normal(0, 0.005, len(x)),
        "train_loss": 7 - 0.3 * x + 0.02 * (x - 4) ** 2 - 0.15 * rise + rng.normal(0, 0.005, len(x)),
        "icl_score": icl + rng.normal(0, noise, len(x)),
    }
    return [
        TrainingPoint(step=i, tokens=round(10**xi), **{k: float(v[i]) for k, v in fields.items()})
        for i, xi in enumerate(x)
    ]


def icl_curve(x: np.ndarray, window_gain: float, early_gain: float = 0.1) -> np.ndarray:
    """An ICL score that falls by ``early_gain`` nats, evenly in log tokens, before the window and
    by ``window_gain`` with the induction heads' rise (the same logistic)."""
    early = np.clip((x - x[0]) / (WINDOW_CENTRE - 0.3 - x[0]), 0, 1)
    return -0.1 - early_gain * early - window_gain * logistic(x, WINDOW_CENTRE, WINDOW_WIDTH)
