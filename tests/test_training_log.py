"""The training log: rows written as the trainer has always written them, read back typed, bad rows
named in one line, and the rows after a resumed checkpoint dropped."""

from __future__ import annotations

import json

import pytest

from qkov.errors import QkovError
from qkov.training_log import (
    METRICS_FILE,
    TrainingPoint,
    append_training_point,
    read_training_log,
    truncate_training_log,
)


def test_a_row_is_written_rounded_in_the_trainers_order_without_unset_fields(tmp_path):
    point = TrainingPoint(
        step=20, tokens=5120, train_loss=4.123456789, eval_loss=4.2, induction_score=0.3333333333,
        previous_token_score=0.25, repeat_loss_first=5.0, repeat_loss_second=1.0000049,
        icl_score=-0.123456789, loss_by_position=[5.1234, 4.0],
    )  # fmt: skip
    append_training_point(tmp_path, point)
    line = (tmp_path / METRICS_FILE).read_text()
    assert line == (
        '{"step": 20, "tokens": 5120, "train_loss": 4.12346, "eval_loss": 4.2, '
        '"loss_by_position": [5.1234, 4.0], "icl_score": -0.12346, "repeat_loss_first": 5.0, '
        '"repeat_loss_second": 1.0, "induction_score": 0.33333, "previous_token_score": 0.25}\n'
    )
    append_training_point(tmp_path, TrainingPoint(step=30, tokens=7680, eval_loss=3.0))
    assert (tmp_path / METRICS_FILE).read_text().splitlines()[1] == (
        '{"step": 30, "tokens": 7680, "eval_loss": 3.0}'
    )  # a zero-layer model logs no repeat fields: they are left out, not null


def test_rows_read_back_as_written_to_the_rounding(tmp_path):
    points = [TrainingPoint(step=s, tokens=100 * s, train_loss=1 / s, icl_score=-s / 7) for s in (1, 2, 3)]
    for point in points:
        append_training_point(tmp_path, point)
    log = read_training_log(tmp_path)
    assert [p.step for p in log] == [1, 2, 3]
    assert [p.train_loss for p in log] == [1.0, 0.5, 0.33333]
    assert [p.icl_score for p in log] == [-0.14286, -0.28571, -0.42857]
    assert log[0].eval_loss is None and log[0].loss_by_position is None


def test_a_log_from_another_program_reads_the_same(tmp_path):
    rows = [
        '{"step": 1, "tokens": 100, "induction_score": 0.1, "my_metric": 3}',
        "",
        '{"step": 2, "tokens": 200}',
    ]
    (tmp_path / METRICS_FILE).write_text("\n".join(rows))
    log = read_training_log(tmp_path)
    assert [p.tokens for p in log] == [100, 200] and log[0].induction_score == 0.1
    assert log[1].eval_loss is None and log[0].my_metric == 3  # unknown fields are kept
    assert read_training_log(tmp_path / "nowhere") == []


def test_unknown_fields_are_written_after_the_known_ones(tmp_path):
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / METRICS_FILE).write_text('{"my_metric": 0.123456789, "tokens": 100, "step": 1}\n')
    (point,) = read_training_log(tmp_path / "theirs")
    append_training_point(tmp_path, point)
    assert (tmp_path / METRICS_FILE).read_text() == '{"step": 1, "tokens": 100, "my_metric": 0.12346}\n'


@pytest.mark.parametrize(
    "line, message",
    [("{not json", "line 2: Invalid JSON"), ('{"step": 2}', "line 2: tokens: Field required")],
)
def test_a_broken_log_line_is_named(tmp_path, line, message):
    (tmp_path / METRICS_FILE).write_text('{"step": 1, "tokens": 100}\n' + line + "\n")
    with pytest.raises(QkovError, match=message):
        read_training_log(tmp_path)
    with pytest.raises(QkovError, match=message):
        truncate_training_log(tmp_path, 1)


def test_a_bad_row_is_not_appended(tmp_path):
    with pytest.raises(QkovError, match="training log row at step x: step: Input should be a valid integer"):
        append_training_point(tmp_path, TrainingPoint(step="x", tokens=1))
    assert not (tmp_path / METRICS_FILE).exists()


def test_truncating_keeps_the_rows_up_to_the_step_as_written(tmp_path):
    lines = [
        '{"step": 10, "tokens": 80, "custom": [1, 2]}',
        '{"tokens": 160, "step": 20}',
        "",
        '{"step": 30, "tokens": 240}',
        '{"step": 40, "tokens": 320}',
    ]
    (tmp_path / METRICS_FILE).write_text("\n".join(lines) + "\n")
    truncate_training_log(tmp_path, 30)
    assert (tmp_path / METRICS_FILE).read_text() == "\n".join(lines[:2] + lines[3:4]) + "\n"
    truncate_training_log(tmp_path, 0)
    assert (tmp_path / METRICS_FILE).read_text() == ""
    truncate_training_log(tmp_path / "nowhere", 5)  # no log: nothing to do
    assert not (tmp_path / "nowhere").exists()


def test_the_trainers_rows_are_the_logs_rows(tmp_path):
    """``json.loads`` of a written line gives the row's own fields: nothing but the rounding changes."""
    point = TrainingPoint(step=3, tokens=9, train_loss=2.5, loss_by_position=[1.5, 2.5], icl_score=1.0)
    append_training_point(tmp_path, point)
    row = json.loads((tmp_path / METRICS_FILE).read_text())
    assert row == {k: v for k, v in vars(point).items() if v is not None}
