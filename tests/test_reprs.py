"""``_repr_html_`` on every result type (``qkov.view.reprs``): each found from the results' type hints,
a result shown by its report section or, alone, by its fields, the whole results folded under their
titles, a model's tensors, and path expansion's terms as bars."""

from __future__ import annotations

import torch

import qkov
from qkov.analyze import run_steps
from qkov.circuits.paths import PathTerms
from qkov.results import Results
from qkov.view.reprs import IdStrings, result_types

from handbuilt import skip_trigram_model


def test_every_result_type_has_an_inline_view():
    types = result_types()
    held = {field for field in types.values() if field}  # the Results fields holding one result each
    singles = {"bigram", "spectra", "copying", "repeated_tokens", "attention_examples", "term_importance"}
    assert held >= singles | {"skip_trigrams", "composition", "phase_change", "config"}
    for cls in [*types, Results, qkov.Reproduction, qkov.Config, qkov.AttnOnlyTransformer, PathTerms]:
        assert callable(getattr(cls, "_repr_html_", None)), cls


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
