"""The HTML report: every token string escaped, self-contained, and rendered by a real headless
Chromium with no console errors (a screenshot is kept in test-artifacts/)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel

from qkov.analyze import analyze
from qkov.report import render_report
from qkov.results import Claim

from handbuilt import induction_model, skip_trigram_model

EVIL = ['<script>alert("x")</script>', '"><img src=x onerror=alert(1)>', "</script><b>bold</b>", "&amp; <!--"]
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"


def evil_tokens(model) -> Tokenizer:
    """A word-level tokenizer whose every token is untrusted markup."""
    vocab = {EVIL[i % len(EVIL)] + str(i): i for i in range(model.cfg.d_vocab)}
    return Tokenizer(WordLevel(vocab, unk_token=next(iter(vocab))))


@pytest.fixture(scope="module")
def reports():
    torch.manual_seed(0)
    models = {"1-layer": skip_trigram_model([(5, 3, 9), (5, 4, 10)]), "2-layer": induction_model()}
    results = {}
    for name, model in models.items():  # untrusted token strings everywhere a token is shown
        model.tokenizer = evil_tokens(model)
        results[name] = analyze(model, show_progress=False)
    claims = [Claim(EVIL[0], "p", EVIL[1], EVIL[2], True)]
    return results, claims


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
        "copying scores against the random baseline",
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
