"""HTML building blocks for the report: tables, figures, token chips and script-safe JSON. Every
text passes through :func:`~qkov.report.svg.esc` unless it is :class:`Raw` (already escaped)."""

from __future__ import annotations

import json

from qkov.report.svg import esc


class Raw(str):
    """Already-escaped HTML for a table cell."""


class Num(str):
    """A number already written out (an estimate and its error, an interval): a table cell aligned
    as floats are, escaped as text is."""


def json_for_script(data: object) -> str:
    """JSON safe inside ``<script>``: no ``</script>``, no HTML entities."""
    return json.dumps(data).replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def _cell(cell: object) -> str:
    if isinstance(cell, float):
        return f'<td class="num">{cell:.3f}</td>'
    if isinstance(cell, Num):
        return f'<td class="num">{esc(cell)}</td>'
    return f"<td>{cell if isinstance(cell, Raw) else esc('—' if cell is None else cell)}</td>"


def table(header: list[str], rows: list[list[object]], classes: list[str] | None = None) -> str:
    """A table; floats get three decimals, ``None`` shows as a dash."""
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{classes[i]}"' if classes and classes[i] else ""
        body.append(f"<tr{cls}>{''.join(_cell(cell) for cell in row)}</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def figure(content: str, caption: str, claim: str | None = None) -> str:
    """A figure with its caption and, when given, what the paper says it should show."""
    claim_html = f' <span class="claim">Paper: {esc(claim)}</span>' if claim else ""
    return f"<figure>{content}<figcaption>{esc(caption)}{claim_html}</figcaption></figure>"


def shown(text: str) -> str:
    """A token as it is displayed: newlines and tabs made visible, so whitespace tokens (common in
    code) do not render as blank boxes."""
    return text.replace("\n", "↵").replace("\t", "⇥")


def tok(text: str) -> Raw:
    return Raw(f'<span class="tok">{esc(shown(text))}</span>')
