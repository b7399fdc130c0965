"""The view of the user's own data (``qkov serve --tokens FILE [--targets FILE]``): every row's
loss and accuracy against its targets, scored as :func:`qkov.circuits.task.scored` scores the
task (the mean over the positions that have a target), and a page of rows to choose from. A chosen
row is shown by :mod:`qkov.serve.text`, as a typed text is, against its own targets.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from qkov.circuits.task import scored
from qkov.data.user_tokens import IGNORE
from qkov.errors import QkovError
from qkov.serve.explorer import Explorer
from qkov.serve.jobs import Progress

BATCH_BYTES = 64 * 2**20  # the logits of one batch of rows
PREVIEW = 8  # tokens of a row shown in the list
MAX_ROWS = 200  # rows listed per page


@dataclass(frozen=True)
class RowScores:
    """Per row: the positions with a target, and the loss and accuracy over them (None: no target)."""

    targeted: list[int]
    loss: list[float | None]
    accuracy: list[float | None]


def row_scores(ex: Explorer, progress: Progress) -> RowScores:
    """Every row's loss and accuracy, the rows run in batches of at most ``BATCH_BYTES`` of logits."""
    tokens, targets = ex.data.tokens, ex.data.targets
    rows, length = tokens.shape
    batch = max(1, BATCH_BYTES // (length * ex.cfg.d_out * 4))
    targeted, losses, accuracies = [], [], []
    for start in range(0, rows, batch):
        progress.step(start, rows, "scoring every row against its targets")
        with torch.no_grad():
            logits = ex.model(tokens[start : start + batch].to(ex.model.device)).cpu()
        for offset, wanted in enumerate(targets[start : start + batch]):
            count = int((wanted != IGNORE).sum())
            loss = accuracy = None
            if count:
                loss, accuracy, _ = scored(logits[offset : offset + 1], wanted[None])
            targeted.append(count)
            losses.append(loss)
            accuracies.append(accuracy)
    return RowScores(targeted, losses, accuracies)


def _mean(values: list[float | None], weights: list[int]) -> float:
    """The mean over every targeted position of the rows' means (weighted by their positions)."""
    return sum(v * w for v, w in zip(values, weights, strict=True) if v is not None) / sum(weights)


def data_rows(ex: Explorer, offset: int, limit: int, progress: Progress) -> dict:
    """The data's description, its loss and accuracy over every targeted position, and rows
    ``offset`` to ``offset + limit``: index, length, positions with a target, loss, accuracy and
    the first ``PREVIEW`` tokens."""
    scores = ex.once("row_scores", lambda: row_scores(ex, progress))
    tokens = ex.data.tokens
    shown = range(offset, min(offset + limit, tokens.shape[0]))
    return {
        "description": ex.data.description,
        "rows": tokens.shape[0],
        "length": tokens.shape[1],
        "targeted": sum(scores.targeted),
        "loss": _mean(scores.loss, scores.targeted),
        "accuracy": _mean(scores.accuracy, scores.targeted),
        "offset": offset,
        "listed": [
            {
                "row": row,
                "length": tokens.shape[1],
                "targeted": scores.targeted[row],
                "loss": scores.loss[row],
                "accuracy": scores.accuracy[row],
                "tokens": [{"id": i, "str": ex.strings[i]} for i in tokens[row, :PREVIEW].tolist()],
            }
            for row in shown
        ],
    }


def check_page(ex: Explorer, offset: int, limit: int) -> None:
    """Refuse a page of rows outside the data, or longer than ``MAX_ROWS``."""
    ex.row(0)  # the data exists
    if not 1 <= limit <= MAX_ROWS:
        raise QkovError(f"limit={limit} out of range: a page lists 1 to {MAX_ROWS} rows")
    if not 0 <= offset < ex.data.tokens.shape[0]:
        raise QkovError(f"offset {offset} out of range: the data has rows 0 to {ex.data.tokens.shape[0] - 1}")
