"""When the induction heads formed during training ("In-context Learning and Induction Heads",
Olsson et al. 2022; the framework paper's section "Two-Layer Attention-Only Transformers"), read off
a checkpoint's training log, ``metrics.jsonl``: one JSON row per evaluation.

The log is read as :class:`TrainingPoint` rows, so a log written by another program in the same
format is judged the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import ConfigDict, TypeAdapter, ValidationError

from qkov.errors import QkovError
from qkov.train import METRICS_FILE


@dataclass(frozen=True)
class TrainingPoint:
    """One evaluation during training: a row of ``metrics.jsonl``. Fields a program did not log are
    ``None``; fields qkov does not know are kept."""

    __pydantic_config__ = ConfigDict(extra="allow")

    step: int
    tokens: int
    train_loss: float | None = None
    eval_loss: float | None = None
    induction_score: float | None = None
    previous_token_score: float | None = None
    repeat_loss_first: float | None = None
    repeat_loss_second: float | None = None


def read_training_log(folder: Path) -> list[TrainingPoint]:
    """The rows of ``folder/metrics.jsonl``, or none when the folder has no log."""
    file = folder / METRICS_FILE
    if not file.is_file():
        return []
    rows = TypeAdapter(TrainingPoint)
    points = []
    for number, line in enumerate(file.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            points.append(rows.validate_json(line))
        except ValidationError as err:
            problem = err.errors()[0]
            where = ".".join(str(p) for p in problem["loc"])
            raise QkovError(
                f"{file}, line {number}: {where + ': ' if where else ''}{problem['msg']}"
            ) from None
    return points


@dataclass(frozen=True)
class PhaseChange:
    """Where the best induction score first passed 10% (``onset_tokens``) and 90%
    (``complete_tokens``) of its rise, their distance as a fraction of the whole run
    (``width_fraction``: the paper's phase change is abrupt, a small fraction), and the middle of the
    interval of the steepest rise."""

    onset_tokens: float
    complete_tokens: float
    width_fraction: float
    steepest_tokens: float
    initial_induction: float
    final_induction: float


def phase_change(training_log: list[TrainingPoint]) -> PhaseChange | None:
    """The phase change in a training log; None without induction scores or without a rise."""
    rows = [row for row in training_log if row.induction_score is not None]
    if len(rows) < 2:
        return None
    start, final = rows[0].induction_score, rows[-1].induction_score
    if final <= start:
        return None

    def first_past(fraction: float) -> float:
        level = start + fraction * (final - start)
        return next(row.tokens for row in rows if row.induction_score >= level)

    steepest = max(
        zip(rows, rows[1:], strict=False), key=lambda p: p[1].induction_score - p[0].induction_score
    )
    onset, complete = first_past(0.1), first_past(0.9)
    return PhaseChange(
        onset_tokens=onset,
        complete_tokens=complete,
        width_fraction=(complete - onset) / rows[-1].tokens,
        steepest_tokens=(steepest[0].tokens + steepest[1].tokens) / 2,
        initial_induction=start,
        final_induction=final,
    )
