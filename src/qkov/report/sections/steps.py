"""Which steps ran, how they were chosen (every step that applies, ``--weights-only``, ``--steps``),
and those run only because a chosen step reads their results."""

from __future__ import annotations

from qkov.report.markup import table
from qkov.report.svg import esc
from qkov.results import Results


def steps_section(r: Results) -> str:
    if r.steps is None:  # a file written before the steps run were kept
        return ""
    ran = ", ".join(r.steps.ran) or "none"
    html = f"<h3>Analyses run</h3><p>{esc(r.steps.chosen)}: {esc(ran)}.</p>"
    if r.steps.added:
        rows = [[name, why] for name, why in r.steps.added.items()]
        html += "<p>Run because a chosen analysis reads them:</p>" + table(["analysis", "why"], rows)
    return html
