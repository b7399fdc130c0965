"""The inline attention viewer and head tables (``qkov.view.attention``): every form of patterns read
with the report's numbers, the hand-built previous-token head's one-back pattern, bad patterns in
one line, and the head table's numbers those of ``analyze``."""

from __future__ import annotations

import pytest
import torch

import qkov
from qkov.analyze import run_steps
from qkov.circuits.heads import attention_example


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


def test_heads_of_a_model_are_analyzes_numbers(induction):
    done = run_steps(induction, ["copying", "copying_direct", "repeated_tokens", "induction_check"])
    html = qkov.view.heads(induction).html
    for behaviour in done["repeated_tokens"].heads:
        assert f'<td class="num">{behaviour.previous_token_score:.3f}</td>' in html
    assert "induction corner plot" in html and "copying scores against the random baseline" in html
    with pytest.raises(qkov.QkovError, match="no layers"):
        qkov.view.heads(qkov.AttnOnlyTransformer(qkov.Config(0, 1, 8, 4, 10, 8)))
