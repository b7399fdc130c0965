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
    assert dom.stdout.count('<span class="tok" style="background: rgba') == 6 + 12  # n_ctx 8 and 12
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
