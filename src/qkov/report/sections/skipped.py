"""The steps that did not run, each with its reason."""

from __future__ import annotations

from qkov.report.markup import table
from qkov.results import EVERY_STEP, Results


def skipped_section(r: Results) -> str:
    if not r.skipped:
        return ""
    rows = [[name, reason] for name, reason in r.skipped.items()]
    chosen = r.steps is not None and r.steps.chosen != EVERY_STEP  # some were left out, not inapplicable
    heading = "Analyses not run" if chosen else "Analyses that did not apply"
    return f"<h3>{heading}</h3>" + table(["analysis", "why"], rows)
