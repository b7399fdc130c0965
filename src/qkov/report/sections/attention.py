"""Attention examples: the interactive viewer and every head's pattern, labelled by token."""

from __future__ import annotations

from qkov.circuits.heads import AttentionExample
from qkov.report.markup import figure, json_for_script, shown
from qkov.report.svg import attention_grid, attention_scale, esc
from qkov.results import Results


def attention_figure(example: AttentionExample, strings: list[str]) -> str:
    data = {"strings": [shown(strings[t]) for t in example.tokens], "patterns": example.patterns}
    viewer = (
        f"<div class='attention-viewer'><script type='application/json'>{json_for_script(data)}</script>"
        "<div class='heads'></div><div class='status small'></div><div class='tokens'></div></div>"
    )
    labels = [shown(strings[t]) for t in example.tokens]
    static = attention_scale() + "".join(
        f"<div><div class='small'>{esc(name)}</div>{attention_grid(name, pattern, labels)}</div>"
        for name, pattern in example.patterns.items()
    )
    return figure(
        viewer + f"<div class='grid'>{static}</div>",
        f"Attention on {example.description}. Pick a head and hover a token to see where it attends (needs "
        "JavaScript); below, every head's pattern (rows: destination, columns: source; hover a cell for "
        "its weight).",
        "previous-token heads attend one back; induction heads attend to the token after the earlier "
        "occurrence of the current token (an off-diagonal stripe one period back).",
    )


def attention_section(r: Results) -> str:
    attention = r.attention_examples
    if attention is None:
        return ""
    examples = [e for e in (attention.repeated, attention.corpus, attention.user) if e is not None]
    return "<h3>Attention patterns</h3>" + "".join(attention_figure(e, r.tokens) for e in examples)
