"""What the report's tests share: the hand-built 1- and 2-layer models with untrusted markup for every
token string and synthetic training logs (the 2-layer one with a phase change around 10M tokens, the
1-layer control), analysed; and the pixels of a figure's embedded PNG."""

from __future__ import annotations

import base64
import os
import re
import shutil
import struct
import zlib
from pathlib import Path

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel

EVIL = ['<script>alert("x")</script>', '"><img src=x onerror=alert(1)>', "</script><b>bold</b>", "&amp; <!--"]


ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"


def evil_tokens(model) -> Tokenizer:
    """A word-level tokenizer whose every token is untrusted markup."""
    vocab = {EVIL[i % len(EVIL)] + str(i): i for i in range(model.cfg.d_vocab)}
    return Tokenizer(WordLevel(vocab, unk_token=next(iter(vocab))))


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


def headless_chromium(window_size: str):
    """A selenium driver of headless Chromium with its console log kept (a generator for a
    fixture: it quits the browser after the module); skipped where Chromium is missing, a failure
    in CI, whose ``make test`` installs it."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        if os.environ.get("CI"):
            pytest.fail("CI must run the browser test: make test installs chromium and chromium-driver")
        pytest.skip("Chromium or chromedriver is not installed (apt-get install chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", f"--window-size={window_size}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    driver.implicitly_wait(0)
    yield driver
    driver.quit()
