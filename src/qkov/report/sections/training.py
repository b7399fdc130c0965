"""Training: the loss curves, the head scores and the per-token loss over training, and the
phase change across the models (Olsson et al.'s signatures)."""

from __future__ import annotations

from qkov.circuits.phase_change import MIN_SLOPE_SPACING, PhaseChange, describe
from qkov.report.markup import figure
from qkov.report.svg import esc, line_chart, training_heatmap
from qkov.results import Results
from qkov.training_log import TrainingPoint


def _window(change: PhaseChange | None) -> list[tuple[float, float, str]]:
    """The phase-change window as a shaded band, when there is one."""
    if change is None:
        return []
    title = f"window: the best induction score's 10%-90% rise, {change.window_decades:.2f} decades"
    return [(change.window_start_tokens, change.window_end_tokens, title)]


def _note(band: list) -> str:
    """What the shading means, or that there is none."""
    if band:
        return "Log axis of training tokens; shaded: the phase-change window (10%-90% of the induction rise)."
    return "Log axis of training tokens; no phase-change window (no rise in the best induction score)."


def _loss_figure(log: list[TrainingPoint], band: list) -> str:
    loss = {
        "train loss": [(row.tokens, row.train_loss) for row in log],
        "eval loss": [(row.tokens, row.eval_loss) for row in log],
    }
    chart = line_chart(loss, "tokens seen", "loss (nats)", label="training loss", log_x=True, bands=band)
    return figure(chart, "Training and eval loss. " + _note(band)) if chart else ""


def _bump_figure(change: PhaseChange | None, band: list) -> str:
    if change is None or not change.loss_slope:
        return ""
    loss = "training" if change.slope_of == "train_loss" else "held-out"
    slope = {f"d {loss} loss / d log10 tokens": change.loss_slope}
    chart = line_chart(slope, "tokens seen", "nats per decade", label="loss slope", log_x=True, bands=band)
    bump = "does" if "loss_bump" in change.signatures else "does not"
    return figure(
        chart,
        f"The {loss} loss's slope per decade of tokens between evaluations at least "
        f"{MIN_SLOPE_SPACING} decades apart (3-point running mean). It {bump} dip inside the window below "
        "its values at both ends. " + _note(band),
        "the phase change is visible as a bump in the training loss.",
    )


def _scores_figure(log: list[TrainingPoint], band: list) -> str:
    if all(row.induction_score is None for row in log):
        return ""  # a 0-layer model, or a log without head scores
    scores = {
        "best induction score": [(row.tokens, row.induction_score) for row in log],
        "best previous-token score": [(row.tokens, row.previous_token_score) for row in log],
    }
    behaviour = {
        "loss on 2nd repeat": [(row.tokens, row.repeat_loss_second) for row in log],
        "loss on 1st repeat": [(row.tokens, row.repeat_loss_first) for row in log],
    }
    charts = line_chart(
        scores, "tokens seen", "attention score", label="head scores during training", log_x=True, bands=band
    ) + line_chart(
        behaviour,
        "tokens seen",
        "loss (nats)",
        label="in-context loss during training",
        log_x=True,
        bands=band,
    )
    return figure(
        charts,
        "The best induction and previous-token scores, and the loss on repeated random tokens, during "
        "training. " + _note(band),
        "induction heads form in a sudden phase change, visible as a drop in the loss on repeated tokens.",
    )


def _per_token_figure(log: list[TrainingPoint], change: PhaseChange | None) -> str:
    rows = sorted((row for row in log if row.loss_by_position and row.tokens > 0), key=lambda row: row.tokens)
    rows = [row for row in rows if len(row.loss_by_position) == len(rows[-1].loss_by_position)]
    if len(rows) < 2:
        return ""
    marks = [(change.window_start_tokens, "10%"), (change.window_end_tokens, "90%")] if change else []
    columns = [row.loss_by_position for row in rows]
    chart, limit = training_heatmap(
        [row.tokens for row in rows], columns, "tokens seen", "token index", marks, "per-token loss"
    )
    return figure(
        chart,
        "Held-out loss at each token index minus the evaluation's mean loss, over training (red: higher, "
        f"blue: lower, saturating at ±{limit:.2f} nats)"
        + ("; dashed: the phase-change window." if marks else "."),
        "before the phase change, loss stops improving around the 50th token; after it, loss keeps "
        "improving later in the context.",
    )


def training_section(r: Results) -> str:
    log = r.training
    if not log:
        return ""
    band = _window(r.phase_change)
    parts = [
        _loss_figure(log, band),
        _bump_figure(r.phase_change, band),
        _scores_figure(log, band),
        _per_token_figure(log, r.phase_change),
    ]
    return "<h3>Training</h3>" + "".join(parts)


def _phase_change_summary(name: str, change: PhaseChange) -> str:
    return f"<p>{esc(name)}: {esc(describe(change))}. Verdict: <b>{esc(change.verdict)}</b>.</p>"


def phase_change_section(models: dict[str, Results]) -> str:
    """Every model's in-context-learning score on one log axis (the paper's comparison of one layer
    with two), shaded by the window of the deepest model that has one."""
    series = {
        name: [(row.tokens, row.icl_score) for row in r.training]
        for name, r in models.items()
        if any(row.icl_score is not None for row in r.training)
    }
    if not series:
        return ""
    changes = [(r.config.n_layers, name, r.phase_change) for name, r in models.items() if r.phase_change]
    deepest = max(changes, key=lambda c: c[0]) if changes else None
    band = _window(deepest[2]) if deepest else []
    chart = line_chart(series, "tokens seen", "loss difference (nats)", label="in-context learning score",
                       log_x=True, bands=band)  # fmt: skip
    caption = (
        "In-context-learning score during training: held-out loss at a late token index minus at an early "
        "one (the paper's 500th minus 50th of 1024, scaled to the context); lower is more in-context "
        "learning. " + _note(band)
    )
    claim = "in-context learning improves abruptly in the phase change, in models of two or more layers only."
    summary = _phase_change_summary(deepest[1], deepest[2]) if deepest else ""
    return (
        '<section id="phase-change"><h2>Phase change</h2>'
        + summary
        + figure(chart, caption, claim)
        + "</section>"
    )
