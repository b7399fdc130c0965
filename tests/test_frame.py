"""One inline output (``qkov.view.frame``): token text escaped, a fresh id per output and its viewer
run on that element alone, the stylesheet scoped to the view, and a saved view one self-contained
file that fetches nothing."""

from __future__ import annotations

import re

import torch

import qkov

from pages import EVIL


def test_token_text_is_escaped_and_each_output_has_its_own_id():
    strings = [EVIL[i % len(EVIL)] for i in range(4)]
    view = qkov.view.attention(strings, {EVIL[0]: torch.eye(4)})  # a head name of markup too
    first, second = view._repr_html_(), view._repr_html_()
    for html in (first, second):
        assert '<script>alert("x")' not in html and "<img src=x" not in html and "<b>bold</b>" not in html
        assert "\\u003cscript\\u003e" in html  # the viewer's data, shown as text by the script
        assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in html  # the static grid's label
    ids = [re.search(r'id="(qkov-[0-9a-f]{32})"', html)[1] for html in (first, second)]
    assert ids[0] != ids[1]
    for html, root in zip((first, second), ids, strict=True):
        assert f"qkovViewers(document.getElementById('{root}'))" in html  # only its own viewer
        assert "document.querySelectorAll" not in html
    assert ".qkov-view table" in first and "\nbody" not in first  # the stylesheet styles the view only


def test_a_saved_view_is_one_self_contained_file(tmp_path, induction):
    file = qkov.view.attention(induction, torch.arange(12), "the first 12 tokens").save(tmp_path / "a.html")
    page = file.read_text()
    assert page.startswith("<!doctype html>") and page.count("qkov-view") >= 1
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)  # nothing fetched
    assert "<title>attention on the first 12 tokens</title>" in page
