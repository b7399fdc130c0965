"""The phase change by the rule of Olsson et al. 2022's signatures, on synthetic logs whose answers
are known in advance (a logistic rise of known width in log tokens), and the log's reading."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import qkov
from qkov.circuits import phase_change as phase_change_module
from qkov.circuits.phase_change import (
    MAX_WINDOW_DECADES,
    local_value,
    loss_slope,
    noise,
    phase_change,
)
from qkov.cli import main
from qkov.numbers import FAILS, HOLDS, UNDETERMINED
from qkov.training_log import TrainingPoint, read_training_log

from handbuilt import induction_model
from phase_logs import GRID, ONE_LAYER_LINEAR, log_of, logistic, two_layer


def test_the_window_of_a_logistic_rise_is_its_known_width():
    change = phase_change(two_layer(width=0.4))
    assert change.window_decades == pytest.approx(0.4, abs=0.01)
    assert math.log10(change.window_start_tokens) == pytest.approx(6.8, abs=0.01)
    assert math.log10(change.window_end_tokens) == pytest.approx(7.2, abs=0.01)
    assert change.window_decades == pytest.approx(
        math.log10(change.window_end_tokens / change.window_start_tokens)
    )
    # the same logistic: 10% to 90%, a little less since each end is read off a local line, which
    # cuts the bend of the logistic (toward a smaller gain: the rule errs against "holds")
    assert change.icl_change == pytest.approx(0.78, abs=0.01) and change.icl_change < 0.8
    assert (change.initial_induction, change.final_induction) == pytest.approx((0.02, 0.52), abs=1e-6)
    assert change.initial_icl == pytest.approx(-0.1, abs=1e-6)
    assert change.signatures == ["induction_score", "icl_score", "loss_bump"]
    assert change.control is None and change.holds is None  # every signature, but no control
    assert change.verdict == UNDETERMINED and change.icl_noise < 1e-5  # a smooth log


def test_all_three_signatures_and_a_control_that_gains_little_hold():
    change = phase_change(two_layer(), ONE_LAYER_LINEAR)
    # over the window (6.8-7.2) the linear control gains 0.5 * 0.4 / 3 nats, the 2-layer run 80% of 1.5
    assert change.control.gain == pytest.approx(0.5 * 0.4 / 3, abs=2e-3)
    assert change.icl_gain == pytest.approx(1.17, abs=0.01) and change.icl_total_gain == pytest.approx(
        1.5, abs=1e-3
    )
    assert change.control.margin == pytest.approx(0.5 * change.icl_gain - change.control.gain)
    assert change.control.verdict == HOLDS and change.holds and change.verdict == HOLDS


def test_a_one_layer_model_that_learns_in_the_same_window_fails_the_control():
    same = log_of(icl_score=-1.0 * logistic(GRID, 7.0, 0.4))  # 0.78 nats inside: more than half of 1.17
    change = phase_change(two_layer(), same)
    assert change.control.gain == pytest.approx(0.78, abs=0.01)
    assert change.control.verdict == FAILS and change.holds is False and change.verdict == FAILS


def test_a_one_layer_model_that_learns_elsewhere_passes_the_control():
    """On the absolute scale, a change far from the window is no window: the old relative rule
    (half of the control's own change in any narrow interval) failed this control."""
    earlier = log_of(icl_score=-0.5 * logistic(GRID, 5.0, 0.4))
    assert phase_change(two_layer(), earlier).control.verdict == HOLDS


def test_a_flat_control_passes_and_a_missing_or_short_one_is_undetermined():
    flat = phase_change(two_layer(), log_of(icl_score=np.full(len(GRID), -0.2)))
    assert flat.control.gain == pytest.approx(0.0, abs=1e-12) and flat.holds
    missing = phase_change(two_layer(), [])
    assert missing.control.gain is None and missing.control.verdict == UNDETERMINED and missing.holds is None
    short = [row for row in ONE_LAYER_LINEAR if row.tokens < 3e6]  # stops before the window (6.3M-15.8M)
    change = phase_change(two_layer(), short)
    assert change.control.verdict == UNDETERMINED and change.verdict == UNDETERMINED
    assert change.control.last_tokens < change.window_start_tokens


def test_noise_decides_between_holds_and_undetermined():
    """The same run with 1 nat of noise on its ICL scores: the gains are no longer clear."""
    rng = np.random.default_rng(0)
    noisy = [TrainingPoint(**{**vars(r), "icl_score": r.icl_score + rng.normal(0, 1.0)}) for r in two_layer()]
    flat = log_of(icl_score=rng.normal(-0.2, 1.0, len(GRID)))
    change = phase_change(noisy, flat)
    assert 0.7 < change.icl_noise < 1.3 and change.control.gain_error > 0.3
    assert change.verdicts["icl_score"] != FAILS and change.verdict == UNDETERMINED


def test_noise_is_the_scatter_about_the_local_trend():
    x = np.linspace(0, 5, 2001)
    assert noise(x, 3 * x - 1) == pytest.approx(0.0, abs=1e-9)  # a straight line has none
    scatter = np.random.default_rng(1).normal(0, 0.05, len(x))
    assert noise(x, np.sin(x) + scatter) == pytest.approx(0.05, rel=0.06)
    assert noise(x[:2], x[:2]) is None
    value, factor = local_value(x, 2 * x, 2.5)  # a line through the evaluations within 0.1 decades
    assert value == pytest.approx(5.0) and factor == pytest.approx(1 / math.sqrt(80), rel=0.02)


def test_a_gradual_rise_is_not_a_phase_change():
    # the logistic is cut 2 decades from its centre, so its 10%-90% part is a little narrower than 2
    change = phase_change(two_layer(width=2.0), ONE_LAYER_LINEAR)
    assert (
        change.window_decades == pytest.approx(2.0, abs=0.06) and change.window_decades > MAX_WINDOW_DECADES
    )
    assert "induction_score" not in change.signatures and not change.holds


def test_no_bump_when_the_loss_slope_only_flattens():
    change = phase_change(two_layer(bump=0.0), ONE_LAYER_LINEAR)
    assert change.signatures == ["induction_score", "icl_score"] and change.holds is False
    slopes = [v for _, v in change.loss_slope]
    assert slopes == sorted(slopes)  # d/dx (7 - 0.3 x + 0.02 (x - 4)^2) = -0.3 + 0.04 (x - 4)
    first = math.log10(change.loss_slope[0][0])
    assert first == pytest.approx(4.075, abs=1e-4) and slopes[0] == pytest.approx(-0.297, abs=1e-4)


def test_icl_outside_the_window_is_not_a_signature():
    late = [
        TrainingPoint(**{**vars(row), "icl_score": float(-logistic(np.array([x]), 8.0, 0.4)[0])})
        for row, x in zip(two_layer(), GRID, strict=True)
    ]
    change = phase_change(late, ONE_LAYER_LINEAR)
    assert change.icl_change == pytest.approx(0.0, abs=1e-3)
    assert change.signatures == ["induction_score", "loss_bump"]


def test_the_window_ends_are_interpolated_in_log_tokens():
    rows = [(1e3, 0.0), (1e4, 0.0), (1e5, 0.2), (1e6, 1.0), (1e7, 1.0)]
    rows_log = [TrainingPoint(step=i, tokens=int(t), induction_score=s) for i, (t, s) in enumerate(rows)]
    change = phase_change(rows_log)
    assert change.window_start_tokens == pytest.approx(10**4.5)  # 0.1 halfway from 0 to 0.2
    assert change.window_end_tokens == pytest.approx(10**5.875)  # 0.9 = 0.2 + 0.875 * 0.8
    assert change.window_decades == pytest.approx(1.375)
    assert change.loss_slope == [] and change.icl_change is None and change.signatures == []
    assert phase_change([]) is None
    diverged = [TrainingPoint(step=9, tokens=int(1e8), induction_score=float("nan"))]
    assert phase_change(rows_log + diverged) == change  # a NaN (a diverged run) is no evaluation
    assert phase_change([TrainingPoint(step=1, tokens=10, induction_score=0.3),
                         TrainingPoint(step=2, tokens=20, induction_score=0.1)]) is None  # fmt: skip


def test_the_loss_slope_by_hand():
    losses = [5.0, 4.0, 3.5, 3.4, 3.0]
    log = [TrainingPoint(step=i, tokens=10 ** (i + 1), train_loss=v) for i, v in enumerate(losses)]
    slope = loss_slope(log)  # slopes -1, -0.5, -0.1, -0.4 per decade
    assert [t for t, _ in slope] == pytest.approx([10**2.5, 10**3.5])
    assert [v for _, v in slope] == pytest.approx([-1.6 / 3, -1.0 / 3])


def test_a_log_without_training_losses_reads_the_bump_off_its_held_out_loss():
    """A checkpoint series logs held-out losses only: the bump is read off them, the same numbers."""
    logged = two_layer()
    held_out = [
        TrainingPoint(**{**vars(row), "train_loss": None, "eval_loss": row.train_loss}) for row in logged
    ]
    change, from_eval = phase_change(logged), phase_change(held_out)
    assert change.slope_of == "train_loss" and from_eval.slope_of == "eval_loss"
    assert from_eval.loss_slope == change.loss_slope and len(change.loss_slope) > 50
    assert from_eval.signatures == change.signatures == ["induction_score", "icl_score", "loss_bump"]
    both = [TrainingPoint(**{**vars(row), "eval_loss": 9.0}) for row in logged]  # the training loss rules
    assert phase_change(both).loss_slope == change.loss_slope


def test_an_old_log_without_the_icl_fields_loads_without_that_signature(tmp_path):
    rows = [
        {"step": i, "tokens": row.tokens, "train_loss": row.train_loss, "eval_loss": 5.0,
         "induction_score": row.induction_score, "previous_token_score": 0.5}
        for i, row in enumerate(two_layer())
    ]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    log = read_training_log(tmp_path)
    assert log[0].icl_score is None and log[0].loss_by_position is None
    change = phase_change(log, ONE_LAYER_LINEAR)
    assert change.icl_change is None and change.initial_icl is None
    assert change.signatures == ["induction_score", "loss_bump"] and change.holds is None
    assert change.verdicts["icl_score"] == UNDETERMINED  # not logged: neither way


def test_a_log_written_by_another_program_is_judged_the_same_way(tmp_path):
    ours = two_layer()
    lines = [
        json.dumps({"tokens": row.tokens, "step": row.step, "icl_score": row.icl_score,
                    "induction_score": row.induction_score, "train_loss": row.train_loss,
                    "loss_by_position": [1.0, 0.5], "their_metric": "x"})
        for row in ours
    ]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n\n")
    theirs = read_training_log(tmp_path)
    assert theirs[3].loss_by_position == [1.0, 0.5] and theirs[3].their_metric == "x"
    assert phase_change(theirs, ONE_LAYER_LINEAR) == phase_change(ours, ONE_LAYER_LINEAR)


def test_analyze_judges_the_log_in_a_checkpoint_folder(tmp_path, capsys):
    folder = tmp_path / "ckpt"
    qkov.save(induction_model(), folder)
    rows = [{k: v for k, v in vars(row).items() if v is not None} for row in two_layer()]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    main(["analyze", str(folder), "--out", str(tmp_path / "out"), "--quiet"])
    change = qkov.load_results(tmp_path / "out" / "results.json").phase_change
    assert change == phase_change(two_layer())  # through results.json and back
    assert change.signatures == ["induction_score", "icl_score", "loss_bump"] and change.control is None
    assert change.holds is None  # not "no": the rule's control is missing
    html = (tmp_path / "out" / "report.html").read_text()
    assert "1-layer control: none in these results (one checkpoint alone; qkov reproduce trains one)" in html
    assert "Verdict: <b>undetermined</b>" in html


def test_evaluations_a_few_thousandths_of_a_decade_apart_make_no_bump(monkeypatch):
    """An ``eval_every`` evaluation 0.002 decades after a log-spaced one, its loss 0.02 nats off (the
    size of the eval noise): the slope over that pair would be 10 nats a decade. The slope skips it,
    so a loss without a bump still has none; taken over every pair, the spikes make one."""
    clean = two_layer(bump=0.0)
    extra = [
        TrainingPoint(step=row.step, tokens=round(row.tokens * 10**0.002), train_loss=row.train_loss + 0.02)
        for row in clean[::7]
    ]
    noisy = sorted(clean + extra, key=lambda row: row.tokens)
    assert loss_slope(noisy) == loss_slope(clean)
    assert "loss_bump" not in phase_change(noisy).signatures
    monkeypatch.setattr(phase_change_module, "MIN_SLOPE_SPACING", 0.0)
    assert "loss_bump" in phase_change(noisy).signatures
