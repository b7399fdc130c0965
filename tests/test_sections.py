"""The report's sections (``report/sections/``) render what the results hold: the phase change's window
and figures, and the batch each ablation ran on."""

from __future__ import annotations

import dataclasses

from qkov.report import render_report

from pages import png_pixels


def test_the_phase_change_figures_show_the_window(reports):
    models, claims = reports
    html = render_report(models, claims)
    assert "2-layer: window 6.31M-15.8M tokens, 0.40 decades (holds;" in html
    assert "ICL gain inside +1.169 ± 0.000 nats of +1.500 over the run (holds); bump: holds" in html
    assert "1-layer control gain over the window +0.067 ± 0.000 nats, margin +0.518 ± 0.000 (holds)" in html
    assert "Verdict: <b>holds</b>" in html
    for label in ("in-context learning score", "loss slope", "head scores during training", "per-token loss"):
        assert f'aria-label="{label}"' in html, label
    assert html.count("shaded: the phase-change window") == 1 + 3  # ICL; the 2-layer loss, slope, scores
    # the per-token loss: 16 token indices (row 0 at the bottom), before the change flat along the
    # context (white), after it lower late in the context (blue) and higher early (red)
    rows = png_pixels(html, "per-token loss")
    assert len(rows) == 16
    assert rows[-1][:3] == bytes((255, 255, 255)) and rows[0][:3] == bytes((255, 255, 255))
    blue, red = rows[0][-3:], rows[-1][-3:]
    assert blue[2] == 255 and blue[0] < 100 and red[0] == 255 and red[2] < 100


def test_the_ablation_figure_says_which_batch_it_ran_on(reports):
    """The caption reads the batch from the results: the default batch (32 sequences, period 4 at
    n_ctx 12), and a batch cut to 3 sequences of period 7 once the results say so."""
    models, claims = reports
    caption = "sequence(s) of random tokens repeating every"
    html = render_report(models, claims)
    assert f"on 32 {caption} 4 positions" in html
    cut = [dataclasses.replace(e, sequences=3, period=7) for e in models["2-layer"].ablation]
    html = render_report(models | {"2-layer": dataclasses.replace(models["2-layer"], ablation=cut)}, claims)
    assert f"on 3 {caption} 7 positions" in html and f"on 32 {caption}" not in html


def test_the_ablation_figure_says_which_ablation_it_ran(reports):
    """Each mode the results hold is defined in the caption; a mode they do not hold is not."""
    models, claims = reports
    html = render_report(models, claims)
    assert (
        "ablated (zero: replaced by zero (the value bias included); mean: replaced by its mean over the "
        "batch at each position)" in html
    )
    batch_mean = [
        dataclasses.replace(e, mode="batch-mean") for e in models["2-layer"].ablation if e.mode == "mean"
    ]
    html = render_report(
        models | {"2-layer": dataclasses.replace(models["2-layer"], ablation=batch_mean)}, claims
    )
    assert "ablated (batch-mean: replaced by its mean over the batch and every position)" in html
    assert "at each position" not in html.split("ablation effects")[1].split("</figure>")[0]
