"""Rotary models: each head's QK circuit by frequency band, and grouped-query attention's groups."""

from __future__ import annotations

from qkov.report.markup import table
from qkov.results import Results


def rotary_bands_section(r: Results) -> str:
    bands = r.rotary_bands
    if bands is None:
        return ""
    rows = [[b.head, b.positional, 1 - b.positional - b.position_free, b.position_free] for b in bands.heads]
    short = bands.positional_wavelength
    return (
        "<h3>Rotary heads by frequency: position and content</h3>"
        + table(["head", f"positional (turn within {short} tokens)", "slower planes", "no rotation"], rows)
        + "<p class='small'>Each head's QK circuit W_E W_Q R(d) W_K^T W_E^T split into its rotation planes "
        "(and the dimensions that do not rotate): each part's share of the sum of the parts' norms at "
        "offset 0. A plane that turns fully within a few tokens can only say how far back to look; a slow "
        "plane, or no rotation, says which tokens to look at wherever they are. Every plane's share and "
        "wavelength are in results.json.</p>"
    )


def gqa_groups_section(r: Results) -> str:
    groups = r.gqa_groups
    if not groups:
        return ""
    rows = []
    for g in groups:
        pairs = [(i, j) for i in range(len(g.heads)) for j in range(i + 1, len(g.heads))]
        ov = [g.ov[i][j] for i, j in pairs] or [1.0]
        qk = [g.qk[i][j] for i, j in pairs] or [1.0]
        rows.append([f"L{g.layer} group {g.group}", " ".join(g.heads), min(ov), max(ov), min(qk), max(qk)])
    return (
        "<h3>Grouped-query attention: the heads of a group side by side</h3>"
        + table(["group", "query heads", "OV cosine, least", "most", "QK cosine, least", "most"], rows)
        + "<p class='small'>The heads of a group share W_K and W_V. Cosines between their full OV circuits "
        "(W_E W_V W_O W_U) and full QK circuits over the whole vocabulary, pair by pair: near 1, the group's "
        "heads read and write alike.</p>"
    )
