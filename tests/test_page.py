"""The report page (``report/page.py``): every token string escaped, self-contained, and rendered by a
real headless Chromium with no console errors (a screenshot is kept in test-artifacts/)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from qkov.report import render_report

from pages import ARTIFACTS


def test_every_token_string_is_escaped(reports):
    models, claims = reports
    html = render_report(models, claims)
    assert '<script>alert("x")' not in html
    assert "<img src=x" not in html
    assert "<b>bold</b>" not in html
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in html  # in tables and SVG text
    assert "\\u003cscript\\u003e" in html  # in the attention viewer's JSON
    # the only scripts are the viewer's data blocks and its code
    scripts = re.findall(r"<script[^>]*>", html)
    assert set(scripts) <= {"<script type='application/json'>", "<script>"}
    assert scripts.count("<script>") == 1


def test_the_report_is_self_contained(reports):
    html = render_report(*reports)
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)
    assert "@import" not in html and "url(" not in html


@pytest.mark.slow
def test_the_report_renders_in_headless_chromium(reports, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        if os.environ.get("CI"):
            pytest.fail("CI must run the browser test: make test installs chromium")
        pytest.skip("Chromium is not installed (make test installs it: apt-get install chromium)")
    page = tmp_path / "report.html"
    page.write_text(render_report(*reports), encoding="utf-8")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0"]
    dump = [chromium, *flags, "--dump-dom", page.as_uri()]
    dom = subprocess.run(dump, capture_output=True, text=True, timeout=120, check=True)
    console = [line for line in dom.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], console
    # the script ran: one button per head in each viewer, tokens inserted as text
    assert dom.stdout.count('<button class="head') == 3 + 4
    painted = re.findall(r'<span class="tok"[^>]* style="background: rgba', dom.stdout)  # title first or not
    assert len(painted) == 6 + 12  # n_ctx 8 and 12
    assert "<img src=x" not in dom.stdout
    for figure in (
        "Q-composition baseline subtracted", "K-composition raw", "induction corner plot",
        "term importance by order", "ablation effects", "eigenvalues of L0H1", "pattern L1H0",
        "copying scores against the random baseline", "in-context learning score", "per-token loss",
        "loss slope", "head scores during training", "training loss",
    ):  # fmt: skip
        assert f'aria-label="{figure}"' in dom.stdout or f"aria-label='{figure}'" in dom.stdout, figure
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "report.png"
    subprocess.run(
        [chromium, *flags, "--window-size=1200,5000", f"--screenshot={shot}", page.as_uri()],
        capture_output=True,
        timeout=120,
        check=True,
    )
    assert shot.stat().st_size > 10_000


@pytest.mark.slow
def test_the_figures_have_colour_bars_labels_and_hover_in_headless_chromium(reports, tmp_path):
    """Each composition map has a colour bar, all six on one scale with the random baseline marked;
    the ablation figure's two maps have their own bars; each attention pattern is labelled by its
    tokens, at least 8 pixels a token, and the cell under the pointer names its weight."""
    from pages import headless_chromium

    page = tmp_path / "report.html"
    page.write_text(render_report(*reports), encoding="utf-8")
    for driver in headless_chromium("1200,1600"):
        driver.get(page.as_uri())
        maps = "svg[aria-label$='-composition raw'], svg[aria-label$='-composition baseline subtracted']"
        bars = driver.execute_script(
            f'return Array.from(document.querySelectorAll("{maps}")).map(s => ['
            "s.querySelector('g.colour-bar').dataset.limit, "
            "Array.from(s.querySelectorAll('.bar-mark')).map(t => t.textContent)])"
        )
        assert len(bars) == 6  # Q, K, V, each raw and baseline-subtracted
        assert all(marks == ["random"] for _, marks in bars)
        assert len({limit for limit, _ in bars}) == 1  # one scale within a figure
        for label in ("ablation effects", "ablation loss change"):
            count = f"return document.querySelectorAll('svg[aria-label=\"{label}\"] g.colour-bar').length"
            assert driver.execute_script(count) == 1
        grid = driver.find_element("css selector", "svg.pattern")
        driver.execute_script("arguments[0].scrollIntoView()", grid)
        labels = driver.execute_script(
            "return Array.from(arguments[0].querySelectorAll('text')).length", grid
        )
        cells = grid.find_elements("css selector", "rect title")
        assert labels >= 2 * 6 and cells  # every token on both axes (the report's n_ctx is 8 or 12)
        cell = cells[0].find_element("xpath", "..")
        assert float(cell.get_attribute("width")) >= 8
        box = cell.rect
        hovered = driver.execute_script(
            "const e = document.elementFromPoint(arguments[0], arguments[1]); "
            "return e && e.querySelector('title') ? e.querySelector('title').textContent : null",
            box["x"] + box["width"] / 2,
            box["y"] + box["height"] / 2 - driver.execute_script("return window.scrollY"),
        )
        assert re.fullmatch(r"L\dH\d: \d+ .* attends to \d+ .*: [01]\.\d{3}", hovered or ""), hovered
        ARTIFACTS.mkdir(exist_ok=True)
        figure = driver.find_element("css selector", "svg[aria-label='K-composition raw']")
        figure.find_element("xpath", "ancestor::figure").screenshot(str(ARTIFACTS / "report-composition.png"))
        grid.find_element("xpath", "ancestor::figure").screenshot(str(ARTIFACTS / "report-attention.png"))
