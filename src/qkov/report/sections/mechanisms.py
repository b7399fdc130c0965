"""How each induction head finds its source: K-composition, pointer arithmetic or other."""

from __future__ import annotations

from qkov.report.markup import figure, table
from qkov.report.sections.common import share
from qkov.results import Results


def induction_mechanism_section(r: Results) -> str:
    rows = r.induction_mechanism
    if not rows:
        return ""
    body = [
        [
            row.head,
            row.mechanism,
            *(share(row.shares[group]) for group in ("k_composition", "pointer", "other")),
            row.margin,
            row.writer,
            ", ".join(f"{t.query} × {t.key} {share(t.share)}" for t in row.top_terms),
        ]
        for row in rows
    ]
    header = ["head", "mechanism", "K-composition", "pointer", "other", "margin", "writer", "largest terms"]
    return figure(
        table(header, body),
        f"Each induction head's pre-softmax margin on the induction target (score there minus the mean "
        f"score elsewhere) on {rows[0].tokens} of period {rows[0].period}, split exactly into (query part "
        "× key part) terms with earlier attention and LayerNorm scales frozen; shares sum to 1. "
        "K-composition: the current token × an earlier head's write of its source's token; pointer: "
        "position parts on both sides, one of them an earlier head's; the mechanism is the group with "
        "the largest share when it has at least half.",
        "the two-layer models' induction heads K-compose with a previous-token head; one GPT-2 induction "
        "head instead uses pointer arithmetic on positions.",
    )
