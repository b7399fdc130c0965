"""Inline views (``src/qkov/view/``): every result type has a ``_repr_html_`` drawn by the report's
renderers, the attention viewer reads every form of patterns with the report's numbers, token text
is escaped, every output has its own id, and a saved view needs no network."""

from __future__ import annotations

import re

import pytest
import torch

import qkov
from qkov.analyze import run_steps
from qkov.circuits.heads import attention_example
from qkov.circuits.paths import PathTerms
from qkov.results import Results
from qkov.view.reprs import IdStrings, result_types

from handbuilt import induction_model, skip_trigram_model
from pages import EVIL


@pytest.fixture(scope="module")
def induction():
    return induction_model(d_vocab=16, n_ctx=12)


def test_every_result_type_has_an_inline_view():
    types = result_types()
    held = {field for field in types.values() if field}  # the Results fields holding one result each
    singles = {"bigram", "spectra", "copying", "repeated_tokens", "attention_examples", "term_importance"}
    assert held >= singles | {"skip_trigrams", "composition", "phase_change", "config"}
    for cls in [*types, Results, qkov.Reproduction, qkov.Config, qkov.AttnOnlyTransformer, PathTerms]:
        assert callable(getattr(cls, "_repr_html_", None)), cls


def test_attention_reads_every_form_of_patterns_with_the_reports_numbers(induction):
    tokens = torch.tensor([3, 5, 7, 9, 3, 5, 7, 9, 3, 5, 7, 9])
    example = attention_example(induction, tokens, "x")
    patterns = qkov.frozen_patterns(induction, tokens[None])
    stacked = torch.stack([layer[0] for layer in patterns])  # [n_layers, n_heads, dest, src]
    named = {name: torch.tensor([row + [0.0] * (12 - len(row)) for row in rows])
             for name, rows in example.patterns.items()}  # fmt: skip
    for form in (patterns, stacked, named):
        assert qkov.view.named_patterns(form, 12) == example.patterns
    assert qkov.view.named_patterns(stacked[0], 12) == {
        k: v for k, v in example.patterns.items() if k[1] == "0"
    }
    # the previous-token head L0H0 puts all its weight one back (the hand-built answer)
    assert [row[-2] for row in example.patterns["L0H0"][1:]] == [1.0] * 11
    # the same numbers whether given the model or its patterns
    strings = [f"#{t}" for t in tokens.tolist()]
    from_model = qkov.view.attention(induction, tokens, "x").html
    from_patterns = qkov.view.attention(strings, patterns, "x").html
    assert from_model == from_patterns
    assert "attention-viewer" in from_model


def test_bad_patterns_are_one_clear_error(induction):
    with pytest.raises(qkov.QkovError, match=r"L0H0's pattern is \[3, 3\], expected \[4, 4\] for 4 tokens"):
        qkov.view.attention(list("abcd"), {"L0H0": torch.eye(3)})
    with pytest.raises(qkov.QkovError, match="patterns must be"):
        qkov.view.attention(list("abcd"), "not patterns")
    with pytest.raises(qkov.QkovError, match="no tokenizer"):
        qkov.view.attention(induction, "some text")


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


def test_a_result_without_its_results_shows_its_section_or_its_fields():
    model = skip_trigram_model([(1, 2, 3), (1, 4, 5)])
    done = run_steps(model, ["skip_trigrams", "repeated_tokens", "copying"])
    trigrams = done["skip_trigrams"]._repr_html_()
    assert "<h3>Skip-trigrams</h3>" in trigrams and ">#1</span>" in trigrams  # tokens as #id
    # the heads table needs three analyses; alone, the repeated-token result shows its fields
    repeated = done["repeated_tokens"]
    html = repeated._repr_html_()
    assert "<h4>RepeatedTokens</h4>" in html and "<h5>heads</h5>" in html
    for behaviour in repeated.heads:
        assert behaviour.name in html
        assert f'<td class="num">{behaviour.induction_score:.3f}</td>' in html
    assert IdStrings()[7] == "#7"


def test_results_show_every_analysis_folded_under_its_title():
    model = skip_trigram_model([(1, 2, 3), (1, 4, 5)])
    done = run_steps(model, ["skip_trigrams", "repeated_tokens", "copying", "copying_direct"])
    r = Results(config=model.cfg, tokens=[f"t{i}" for i in range(16)], training=[], phase_change=None, **done)
    html = r._repr_html_()
    for title in ("Repeated random tokens", "Copying (OV eigenvalues)", "Skip-trigrams", "Direct copying"):
        assert f"<summary>{title}" in html
    assert "<b>trained by qkov</b>" in html and ">t1</span>" in html
    assert "blocks.0.attn.W_Q" in model._repr_html_() and "[3, 16, 16]" in model._repr_html_()


def test_heads_of_a_model_are_analyzes_numbers(induction):
    done = run_steps(induction, ["copying", "copying_direct", "repeated_tokens", "induction_check"])
    html = qkov.view.heads(induction).html
    for behaviour in done["repeated_tokens"].heads:
        assert f'<td class="num">{behaviour.previous_token_score:.3f}</td>' in html
    assert "induction corner plot" in html and "copying scores against the random baseline" in html
    with pytest.raises(qkov.QkovError, match="no layers"):
        qkov.view.heads(qkov.AttnOnlyTransformer(qkov.Config(0, 1, 8, 4, 10, 8)))


def test_path_terms_are_the_same_dict_and_show_as_bars(induction):
    tokens = torch.tensor([[3, 5, 7, 9, 3, 5]])
    terms = qkov.path_expansion(induction, tokens)
    assert isinstance(terms, PathTerms) and isinstance(terms, dict)
    total = sum(terms.values())
    torch.testing.assert_close(total, induction(tokens), atol=1e-4, rtol=1e-4)
    html = terms._repr_html_()
    rms = float(terms[("L1H0",)].double().pow(2).mean().sqrt())
    assert f"L1H0: {rms:.4f}" in html and "L0H0 → L1H0" in html
    assert [PathTerms.label(k) for k in ((), ("L0H1", "L1H0"), 1, "bias")] == [
        "direct", "L0H1 → L1H0", "order 1", "bias"
    ]  # fmt: skip
