"""The training log, ``metrics.jsonl``: one JSON row per evaluation during training, appended by the
trainer (:mod:`qkov.train`) and read by the phase change (:mod:`qkov.circuits.phase_change`), the
analyses and ``qkov info``, and written in the same format by a checkpoint series
(:mod:`qkov.series`, ``series.jsonl``). This module is the one owner of the file's name, of its rows' type
(:class:`TrainingPoint`) and of how they are written and read.

A row is written as one JSON object: floats rounded to 5 decimals (lists, such as
``loss_by_position``, as given), fields in :data:`WRITE_ORDER` and then any extra ones, and fields
that are ``None`` left out. A log written by another program in the same format is read the same
way: fields it did not log are ``None``, fields qkov does not know are kept.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, TypeAdapter, ValidationError

from qkov.errors import QkovError
from qkov.io import atomic_write_text

METRICS_FILE = "metrics.jsonl"
DECIMALS = 5  # a logged float's decimals: far below the run-to-run noise of any logged loss


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
    icl_score: float | None = None  # loss at a late token index minus loss at an early one
    icl_score_se: float | None = None  # its standard error over the evaluation's held-out windows
    loss_by_position: list[float] | None = None  # held-out loss of the prediction at each index


#: The order of a written row's fields (the order the trainer has always written them in).
WRITE_ORDER = (
    "step", "tokens", "train_loss", "eval_loss", "loss_by_position", "icl_score", "icl_score_se",
    "repeat_loss_first", "repeat_loss_second", "induction_score", "previous_token_score",
)  # fmt: skip

_ROWS = TypeAdapter(TrainingPoint)


def _validated(where: str, validate) -> TrainingPoint:
    """``validate()``'s row, or one line naming ``where`` and the first problem."""
    try:
        return validate()
    except ValidationError as err:
        problem = err.errors()[0]
        field = ".".join(str(p) for p in problem["loc"])
        raise QkovError(f"{where}: {field + ': ' if field else ''}{problem['msg']}") from None


def _rows(file: Path) -> list[tuple[str, TrainingPoint]]:
    """Every non-blank line of ``file`` with its validated row."""
    lines = []
    for number, line in enumerate(file.read_text().splitlines(), start=1):
        if line.strip():
            row = _validated(f"{file}, line {number}", lambda line=line: _ROWS.validate_json(line))
            lines.append((line, row))
    return lines


def read_points(file: Path) -> list[TrainingPoint]:
    """The rows of a file in this format (``metrics.jsonl``, a checkpoint series' log), or none
    when there is no such file."""
    return [row for _, row in _rows(file)] if file.is_file() else []


def read_training_log(folder: str | os.PathLike) -> list[TrainingPoint]:
    """The rows of ``folder/metrics.jsonl``, or none when the folder has no log."""
    return read_points(Path(folder) / METRICS_FILE)


def row_fields(point: TrainingPoint) -> dict[str, Any]:
    """A row's fields as the log writes them; see the module docstring."""
    values = vars(point)
    order = [*WRITE_ORDER, *(k for k in values if k not in WRITE_ORDER)]
    row = {k: values[k] for k in order if values.get(k) is not None}
    return {k: round(v, DECIMALS) if isinstance(v, float) else v for k, v in row.items()}


def append_training_point(folder: str | os.PathLike, point: TrainingPoint) -> None:
    """Append ``point`` to ``folder/metrics.jsonl`` (validated first: a bad row is one line)."""
    _validated(f"training log row at step {point.step}", lambda: _ROWS.validate_python(vars(point)))
    with open(Path(folder) / METRICS_FILE, "a", encoding="utf-8") as f:
        f.write(json.dumps(row_fields(point)) + "\n")


def write_points(file: Path, points: list[TrainingPoint]) -> None:
    """Write ``points`` as the whole of ``file``, atomically (each validated first)."""
    for point in points:
        _validated(f"training log row at step {point.step}", lambda p=point: _ROWS.validate_python(vars(p)))
    atomic_write_text(file, "".join(json.dumps(row_fields(point)) + "\n" for point in points))


def truncate_training_log(folder: str | os.PathLike, step: int) -> None:
    """Drop the rows logged after ``step`` (a run resumed from its checkpoint at ``step`` logs them
    again); the rows kept are kept as written, and the file is rewritten atomically."""
    file = Path(folder) / METRICS_FILE
    if file.exists():
        keep = [line for line, row in _rows(file) if row.step <= step]
        atomic_write_text(file, "".join(line + "\n" for line in keep))
