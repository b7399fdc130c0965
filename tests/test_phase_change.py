"""The phase change read off a training log, and the log's reading with clear errors."""

from __future__ import annotations

import pytest

from qkov.circuits.phase_change import TrainingPoint, phase_change, read_training_log
from qkov.errors import QkovError


def points(scores: list[tuple[int, float]]) -> list[TrainingPoint]:
    return [TrainingPoint(step=i, tokens=t, induction_score=s) for i, (t, s) in enumerate(scores)]


def test_phase_change_is_where_the_induction_score_rises():
    change = phase_change(points([(0, 0.0), (10, 0.02), (20, 0.05), (30, 0.3), (40, 0.38), (50, 0.4)]))
    assert change.onset_tokens == 20 and change.complete_tokens == 40  # 10% = 0.04, 90% = 0.36
    assert change.width_fraction == pytest.approx(20 / 50)
    assert change.steepest_tokens == 25 and change.final_induction == 0.4
    assert phase_change([]) is None
    assert phase_change(points([(1, 0.3), (2, 0.1)])) is None  # no rise


def test_a_log_from_another_program_reads_the_same(tmp_path):
    rows = [
        '{"step": 1, "tokens": 100, "induction_score": 0.1, "my_metric": 3}',
        "",
        '{"step": 2, "tokens": 200}',
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(rows))
    log = read_training_log(tmp_path)
    assert [p.tokens for p in log] == [100, 200] and log[0].induction_score == 0.1
    assert log[1].eval_loss is None and log[0].my_metric == 3  # unknown fields are kept
    assert read_training_log(tmp_path / "nowhere") == []


@pytest.mark.parametrize(
    "line, message",
    [("{not json", "line 2: Invalid JSON"), ('{"step": 2}', "line 2: tokens: Field required")],
)
def test_a_broken_log_line_is_named(tmp_path, line, message):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "tokens": 100}\n' + line + "\n")
    with pytest.raises(QkovError, match=message):
        read_training_log(tmp_path)
