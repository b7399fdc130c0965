"""Position against content in every head's attention scores."""

from __future__ import annotations

from qkov.report.markup import table
from qkov.results import Results


def position_content_section(r: Results) -> str:
    terms = r.qk_position_content
    if not terms:
        return ""
    names = list(next(iter(terms.values())))
    rows = [[name, *(terms[term][name] for term in terms)] for name in names]
    return (
        "<h3>Position versus content in the attention scores</h3>"
        + table(["head", *(term.replace("_", "-") for term in terms)], rows)
        + "<p class='small'>Root mean square of each token/position term of every head's attention "
        "scores (query side first): where a head looks by content, by position, or by both.</p>"
    )
