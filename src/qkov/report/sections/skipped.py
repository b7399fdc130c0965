"""The steps that did not run, each with its reason."""

from __future__ import annotations

from qkov.report.markup import table
from qkov.results import Results


def skipped_section(r: Results) -> str:
    if not r.skipped:
        return ""
    rows = [[name, reason] for name, reason in r.skipped.items()]
    return "<h3>Analyses that did not apply</h3>" + table(["analysis", "why"], rows)
