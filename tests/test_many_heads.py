"""A model of 1,024 heads (32 layers x 32, random weights): composition keeps each kind's strongest
pairs and its strongest score between each two layers, equal to those read off every pair; the
report draws those (three 32 x 32 layer maps and three tables) instead of 1,024 x 1,024 maps, in
under 600 KB, and says what it shows; a model of 64 heads or fewer keeps its maps of every pair."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from qkov.analyze import analyze
from qkov.circuits.composition import TOP_PAIRS, Composition, all_raw_composition_scores, strongest_pairs
from qkov.config import Config
from qkov.model import AttnOnlyTransformer
from qkov.report import render_report
from qkov.report.sections.composition import composition_section
from qkov.results import Results

REPORT_MAX_BYTES = 600_000


def analysed(n_layers: int, n_heads: int) -> tuple[AttnOnlyTransformer, Results]:
    torch.manual_seed(0)
    cfg = Config(n_layers=n_layers, n_heads=n_heads, d_model=32, d_head=8, d_vocab=64, n_ctx=16)
    model = AttnOnlyTransformer(cfg)
    return model, analyze(model, show_progress=False, steps=["composition"])


@pytest.fixture(scope="module")
def many() -> tuple[AttnOnlyTransformer, Results]:
    return analysed(32, 32)


def test_the_strongest_pairs_and_layer_maxima_are_those_of_every_pair(many):
    _, r = many
    c = r.composition
    for kind, pairs in (("Q", c.Q), ("K", c.K), ("V", c.V)):
        assert len(pairs) == 32 * 32 * 32 * 31 // 2
        ranked = sorted(pairs, key=lambda p: -p.score)[:TOP_PAIRS]
        assert c.top[kind] == ranked
        best: dict[tuple[int, int], float] = {}
        for p in pairs:
            at = (int(p.writer[1 : p.writer.index("H")]), int(p.reader[1 : p.reader.index("H")]))
            best[at] = max(best.get(at, -1e9), p.score)
        expected = [[best.get((w, rd)) for rd in range(32)] for w in range(32)]
        assert c.layers[kind] == expected


def test_pairs_filtered_by_layer_and_paged(many):
    model, r = many
    raw = all_raw_composition_scores(model)["K"]
    every = sorted((p for p in r.composition.K if p.writer.startswith("L3H") and p.reader.startswith("L7H")),
                   key=lambda p: -p.score)  # fmt: skip
    page, total = strongest_pairs(raw, r.composition.baseline, 10, writer_layer=3, reader_layer=7, offset=5)
    assert total == 32 * 32 and page == every[5:15]
    assert strongest_pairs(raw, r.composition.baseline, 10, writer_layer=7, reader_layer=3) == ([], 0)


def test_the_report_of_1024_heads_is_small_and_draws_no_map_of_every_pair(many):
    _, r = many
    html = render_report({"32-layer": r})
    assert len(html.encode()) < REPORT_MAX_BYTES
    assert "This model has 1,024 heads: instead of 1,024 x 1,024 maps of every pair" in html
    labels = re.findall(r'aria-label="([^"]*)"', html)
    assert [label for label in labels if "composition" in label] == [
        "Q-composition by layer", "K-composition by layer", "V-composition by layer"
    ]  # fmt: skip
    assert html.count("<rect") < 4 * 32 * 32 + 200  # three 32 x 32 maps and their colour bars
    assert "the 32 strongest of 507,904 pairs" in html
    strongest = r.composition.top["K"][0]
    assert f"<td>{strongest.writer}</td><td>{strongest.reader}</td>" in html


def test_an_older_file_of_many_heads_says_to_analyze_again(many):
    _, r = many
    old = dataclasses.replace(r, composition=dataclasses.replace(r.composition, top={}, layers={}))
    html = composition_section(old)
    assert "analyze the model again" in html and "<svg" not in html


def test_a_model_of_64_heads_keeps_its_maps_of_every_pair():
    _, r = analysed(4, 16)
    html = composition_section(r)
    assert "maps of every pair" not in html
    assert 'aria-label="K-composition raw"' in html and "L3H15" in html
    assert isinstance(r.composition, Composition) and len(r.composition.top["K"]) == TOP_PAIRS


def test_a_composition_shown_alone_in_a_notebook_knows_its_heads(many):
    """A notebook draws a ``Composition`` with no config beside it: the section counts the heads
    from the pairs, and a model of 1,024 heads gets its per-layer maps there too."""
    _, results = many
    html = results.composition._repr_html_()
    assert "This model has 1,024 heads" in html
    small = analyze(AttnOnlyTransformer(Config(2, 2, 16, 8, 20, 8)), show_progress=False, weights_only=True)
    assert "This model has" not in small.composition._repr_html_()
