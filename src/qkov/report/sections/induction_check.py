"""The K-composition induction check: each later head's copying against its K-composition."""

from __future__ import annotations

from qkov.report.markup import figure
from qkov.report.sections.common import BLUE, RED
from qkov.report.svg import scatter
from qkov.results import Results


def induction_section(r: Results) -> str:
    rows, repeated = r.induction_check, r.repeated_tokens
    if not rows or repeated is None:
        return ""
    scores = {h.name: h.induction_score for h in repeated.heads}
    points = []
    for row in rows:
        copying = row.ov_copying if row.ov_copying is not None else 0.0
        label = (
            f"{row.head}: copying {copying:+.2f}, K-composition with {row.writer} "
            f"{row.k_composition_positivity:+.2f}, induction {scores[row.head] or 0.0:.2f}"
        )
        colour = RED if row.head in repeated.induction_heads else BLUE
        points.append(
            {
                "x": copying,
                "y": row.k_composition_positivity,
                "label": label,
                "text": row.head,
                "colour": colour,
            }
        )
    # the copying score's random baseline: its 99th percentile over random matrices of the same shapes
    marks = [(r.copying.threshold, "random, 99th pct")] if r.copying else []
    dashed = (
        f"; dashed: {r.copying.threshold:+.2f}, the 99th percentile of random heads' copying" if marks else ""
    )
    plot = scatter(
        points,
        "OV copying score",
        "K-composition positivity (best earlier head)",
        (-1, 1),
        (-1, 1),
        "induction corner plot",
        marks=marks,
    )
    return figure(
        plot,
        "Each later-layer head: its OV copying score against the eigenvalue positivity of its token-level "
        "K-composition term with the earlier head that gives the strongest (red: induction score above "
        f"{repeated.induction_threshold}{dashed}).",
        "induction heads sit in the top-right corner: they copy, and match 'same token' through the "
        "previous-token head.",
    )
