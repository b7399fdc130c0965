"""The report's HTML building blocks (``report/markup.py``): tables that escape every cell unless it is
already HTML, JSON that cannot close its script, and token chips with whitespace made visible."""

from __future__ import annotations

import json

from qkov.report.markup import Num, Raw, figure, json_for_script, shown, table, tok


def test_a_table_escapes_its_cells_formats_floats_and_dashes_none():
    html = table(["a<b", "n"], [["<i>x</i>", 0.12345], [Raw("<b>ok</b>"), None]], ["bug", ""])
    assert "<th>a&lt;b</th>" in html and "<td>&lt;i&gt;x&lt;/i&gt;</td>" in html
    assert '<td class="num">0.123</td>' in html and "<td><b>ok</b></td>" in html and "<td>—</td>" in html
    assert '<tr class="bug">' in html and html.count("<tr") == 3


def test_a_number_written_out_is_aligned_as_a_float_and_escaped():
    html = table(["mean"], [[Num("0.512 ± 0.031")], [Num("<1")]])
    assert '<td class="num">0.512 ± 0.031</td>' in html and '<td class="num">&lt;1</td>' in html


def test_json_for_a_script_cannot_end_the_script_and_reads_back():
    data = {"strings": ["</script><script>alert(1)</script>", "a & b"]}
    text = json_for_script(data)
    assert "</script>" not in text and "<" not in text and "&" not in text
    assert json.loads(text) == data


def test_tokens_show_their_whitespace_and_escape_markup():
    assert shown("\n\tx") == "↵⇥x"
    assert tok("<b>\n") == '<span class="tok">&lt;b&gt;↵</span>' and isinstance(tok("x"), Raw)


def test_a_figure_says_what_the_paper_claims_when_given():
    assert figure("<svg/>", "a < b") == "<figure><svg/><figcaption>a &lt; b</figcaption></figure>"
    assert '<span class="claim">Paper: copies</span>' in figure("", "c", "copies")
