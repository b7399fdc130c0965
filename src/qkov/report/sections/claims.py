"""The paper's claims, each with what was measured here and whether it holds."""

from __future__ import annotations

from qkov.report.markup import table
from qkov.results import Claim


def claims_section(claims: list[Claim]) -> str:
    rows = [
        [claim.claim, claim.paper, claim.measured, claim.rule, "yes" if claim.holds else "no"]
        for claim in claims
    ]
    classes = ["holds" if claim.holds else "fails" for claim in claims]
    held = sum(claim.holds for claim in claims)
    return (
        f'<section id="claims"><h2>Claims: {held} of {len(claims)} hold</h2>'
        + table(["claim", "paper", "measured here", "holds when", "holds"], rows, classes)
        + "</section>"
    )
