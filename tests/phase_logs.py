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
