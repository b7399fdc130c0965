"""The report's drawing (``report/svg.py``): colour scales with known values, the per-token heatmap
centred on each evaluation's mean and saturating at its stated share of cells, attention grids that
draw exactly the weights above their floor, and every label escaped."""

from __future__ import annotations

import re

import pytest

from qkov.report.svg import (
    attention_grid,
    diverging,
    diverging_rgb,
    esc,
    heatmap,
    line_chart,
    saturation,
    sequential,
    shared_limit,
    training_heatmap,
)

from pages import png_pixels


def test_the_diverging_scale_runs_blue_white_red_and_greys_the_undefined():
    assert diverging_rgb(0.0, 1.0) == (255, 255, 255)
    assert diverging_rgb(2.0, 1.0) == (255, 0, 0) and diverging_rgb(-5.0, 1.0) == (0, 0, 255)  # saturated
    assert diverging_rgb(0.5, 1.0) == (255, 128, 128) and diverging_rgb(-0.5, 1.0) == (128, 128, 255)
    assert diverging_rgb(None, 1.0) == diverging_rgb(float("nan"), 1.0) == (221, 221, 221)
    assert sequential(0.0) == "rgb(255,255,255)" and sequential(1.0) == "rgb(55,85,195)"


def test_saturation_leaves_the_stated_share_of_cells_inside_the_scale():
    values = [float(v) for v in range(-10, 11)]  # |v|: 0, 1, 1, ..., 10, 10; 21 values
    assert saturation(values, 0.95) == 10.0  # index int(0.95 * 20) = 19 of the sorted sizes
    assert saturation(values, 0.5) == 5.0
    assert saturation([0.0, 0.0], 0.95) == 1.0  # nothing to scale: a unit scale, not zero


def test_the_training_heatmap_colours_each_evaluation_against_its_own_mean():
    """Two evaluations of three token indices: [1, 2, 3] (mean 2: blue, white, red from the bottom)
    and [5, 5, 5] (all at its mean: white), on a scale that saturates at 1."""
    columns = [[1.0, 2.0, 3.0], [5.0, 5.0, 5.0]]
    chart, limit = training_heatmap([1e3, 1e5], columns, "tokens", "index", label="per-token loss")
    assert limit == 1.0
    rows = png_pixels(chart, "per-token loss")
    assert len(rows) == 3  # index 2 on top
    top, middle, bottom = rows
    assert (
        top[:3] == bytes((255, 0, 0))
        and middle[:3] == bytes((255, 255, 255))
        and bottom[:3] == bytes((0, 0, 255))
    )
    assert {top[-3:], middle[-3:], bottom[-3:]} == {bytes((255, 255, 255))}


def test_an_attention_grid_draws_the_weights_above_its_floor():
    pattern = [[1.0], [0.5, 0.5], [0.01, 0.0, 0.99]]
    grid = attention_grid("L0H1 <b>", pattern, ["a", "<i>", "c"])
    cells = re.findall(r"<rect x=[^>]*><title>([^<]*)</title>", grid)
    assert len(cells) == 4  # 0.01 and 0.0 are left blank
    assert cells[1] == "L0H1 &lt;b&gt;: 1 &lt;i&gt; attends to 0 a: 0.500"  # each weight on hover
    assert "pattern L0H1 &lt;b&gt;" in grid and "<b>" not in grid and "<i>" not in grid
    labels = re.findall(r"<text [^>]*>([^<]*)</text>", grid)
    assert labels == ["0 a", "0 a", "1 &lt;i&gt;", "1 &lt;i&gt;", "2 c", "2 c"]  # each token, both axes
    assert int(re.search(r'width="(\d+)"', grid)[1]) >= 60  # 20-pixel cells when short


def test_a_long_pattern_keeps_readable_cells():
    n = 128
    grid = attention_grid("L0H0", [[1.0 / (d + 1)] * (d + 1) for d in range(n)], [f"t{i}" for i in range(n)])
    sizes = {float(w) for w in re.findall(r'<rect x="[^"]*" y="[^"]*" width="([^"]*)" height', grid)[1:]}
    assert sizes == {8.0}  # 8 pixels a token at the most, where 144 // 128 gave 1 before


def test_a_heatmap_is_centred_at_zero_with_a_colour_bar_and_its_marks():
    chart = heatmap(
        [[-0.015, 0.015], [0.5, None]], ["a", "b"], ["c", "d"], 0.5, scale="K raw", marks=[(0.2, "random")]
    )
    fills = re.findall(r'fill="(rgb\([^)]*\))"><title>', chart)
    assert (
        fills[0] == diverging(-0.015, 0.5) and fills[2] == "rgb(255,0,0)"
    )  # +0.5 saturates at the shared 0.5
    light = diverging_rgb(-0.015, 0.5)
    assert min(light) > 240  # a score near zero is nearly white, not pure blue
    bar = chart[chart.index('class="colour-bar"') :]
    assert 'data-limit="0.5"' in bar and "K raw" in bar
    assert re.findall(r'class="bar-tick"[^>]*>([^<]*)<', bar) == ["0.5", "0", "-0.5"]
    assert re.findall(r'class="bar-mark"[^>]*>([^<]*)<', bar) == ["random"]
    assert "-.015" in chart and "a → c: -0.015" in chart  # printed in the cell and on hover


def test_shared_limit_is_the_largest_magnitude_of_every_grid():
    assert shared_limit([[0.1, None]], [[-0.4], [float("nan")]]) == 0.4
    assert shared_limit([[None]]) == 1.0


def test_labels_and_tooltips_are_escaped():
    chart = heatmap([[0.5]], ['<img src=x onerror="1">'], ["</svg>"], label="a & b")
    assert "<img" not in chart and chart.count("</svg>") == 1
    assert esc('<img src=x onerror="1">') in chart and 'aria-label="a &amp; b"' in chart
    assert "→ &lt;/svg&gt;: 0.5<" in chart


@pytest.mark.parametrize("text, escaped", [("<", "&lt;"), ('"', "&quot;"), ("'", "&#x27;"), ("&", "&amp;")])
def test_esc_escapes_markup_and_both_quotes(text, escaped):
    assert esc(text) == escaped


def test_the_circuit_diagram_draws_each_edge_by_kind_and_escapes_labels():
    from qkov.report.svg import EDGE_COLOURS, circuit_diagram

    layers = [[("L0H0", "<b>previous</b>"), ("L0H1", "")], [("L1H0", "induction")]]
    edges = [("L0H0", "L1H0", "K", 0.8), ("L0H1", "L1H0", "V", -0.2)]
    svg = circuit_diagram(layers, edges)
    assert "<b>" not in svg and "&lt;b&gt;previous&lt;/b&gt;" in svg
    drawn = re.findall(r'<line [^>]*stroke="(#[0-9a-f]+)" stroke-width="([0-9.]+)"', svg)
    assert drawn[:2] == [(EDGE_COLOURS["K"], "4.8"), (EDGE_COLOURS["V"], "1.8")]  # 0.8 + 5 |weight|
    assert svg.count('stroke-dasharray="5 3"') == 1  # the negative edge
    assert "L0H0 → L1H0 K: +0.80" in svg


def test_a_line_chart_draws_a_single_point_series_as_a_dot():
    chart = line_chart({"two": [(1.0, 0.5), (2.0, 1.0)], "one": [(2.0, -0.5)]}, "x", "y")
    assert chart.count("<polyline") == 2
    assert chart.count("<circle") == 1
