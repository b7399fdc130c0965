"""The paper's claims, each with what was measured here and whether it holds."""

from __future__ import annotations

from qkov.claims import figure_text, tally
from qkov.numbers import FAILS, HOLDS
from qkov.report.markup import esc, table
from qkov.results import Claim


def claims_section(claims: list[Claim]) -> str:
    rows = [
        [claim.claim, claim.paper, claim.measured, claim.rule, figure_text(claim), claim.verdict, claim.note]
        for claim in claims
    ]
    classes = [{HOLDS: "holds", FAILS: "fails"}.get(claim.verdict, "undetermined") for claim in claims]
    return (
        f'<section id="claims"><h2>Claims: {esc(tally(claims))}</h2>'
        + table(["claim", "paper", "measured here", "holds when", "figure", "verdict", "note"], rows, classes)
        + "</section>"
    )
