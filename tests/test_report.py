"""The HTML report: every token string escaped, self-contained, and rendered by a real headless
Chromium with no console errors (a screenshot is kept in test-artifacts/)."""

from __future__ import annotations

import base64
import dataclasses
import os
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel

from phase_logs import ONE_LAYER_LINEAR, two_layer, with_positions
from qkov.analyze import analyze
from qkov.circuits.phase_change import phase_change
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
    """The hand-built models with synthetic training logs: the 2-layer one with a phase change around
    10M tokens, and (as reproduce does) the 1-layer control in its phase change."""
    torch.manual_seed(0)
    models = {"1-layer": skip_trigram_model([(5, 3, 9), (5, 4, 10)]), "2-layer": induction_model()}
    logs = {"1-layer": with_positions(ONE_LAYER_LINEAR), "2-layer": with_positions(two_layer())}
    results = {}
    for name, model in models.items():  # untrusted token strings everywhere a token is shown
        model.tokenizer = evil_tokens(model)
        results[name] = analyze(model, None, logs[name], show_progress=False)
    change = phase_change(logs["2-layer"], logs["1-layer"])
    results["2-layer"] = dataclasses.replace(results["2-layer"], phase_change=change)
    claims = [Claim(EVIL[0], "p", EVIL[1], EVIL[2], True)]
    return results, claims


def png_pixels(html: str, label: str) -> list[bytes]:
    """The rows of RGB bytes of the PNG inside the figure labelled ``label``."""
    figure = html[html.index(f'aria-label="{label}"') :]
    data = base64.b64decode(re.search(r"data:image/png;base64,([A-Za-z0-9+/=]+)", figure).group(1))
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    idat = data.index(b"IDAT")
    raw = zlib.decompress(data[idat + 4 : idat + 4 + struct.unpack(">I", data[idat - 4 : idat])[0]])
    rows = [raw[r * (3 * width + 1) : (r + 1) * (3 * width + 1)] for r in range(height)]
    assert all(row[0] == 0 for row in rows)  # no filter
    return [row[1:] for row in rows]


def test_the_phase_change_figures_show_the_window(reports):
    models, claims = reports
    html = render_report(models, claims)
    assert "2-layer: window 6,309,573-15,848,932 tokens (0.40 decades)" in html
    assert "80% of its change inside; signatures inside: induction_score, icl_score, loss_bump" in html
    assert "1-layer control: no window (narrowest half-change window 1.50 decades)" in html
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
