"""Every head's full-vocabulary OV and QK spectra."""

from __future__ import annotations

from qkov.report.markup import table
from qkov.report.svg import esc
from qkov.results import Results


def spectra_section(r: Results) -> str:
    spectra = r.spectra
    if spectra is None:
        return ""
    scores = {h.name: h.copying_score for h in r.copying.heads} if r.copying else {}
    parts = ["<h3>Spectra over the whole vocabulary</h3>"]
    for circuit, rows, formula in (
        ("OV", spectra.OV, "W_E W_V W_O W_U"),
        ("QK", spectra.QK, "W_E W_Q W_K^T W_E^T / sqrt(d_head)"),
    ):
        header = ["head", "norm", "singular values (top 3)", "effective rank"]
        header += ["eigenvalue copying score"] if circuit == "OV" else []
        cells = [
            [h.name, h.norm, " ".join(f"{x:.3g}" for x in h.singular_values[:3]), h.effective_rank]
            + ([scores.get(h.name)] if circuit == "OV" else [])
            for h in rows
        ]
        parts.append(f"<h4>{circuit}: {esc(formula)}</h4>" + table(header, cells))
    parts.append(
        "<p class='small'>Frobenius norm, largest singular values and effective rank (exp of the entropy of "
        "s²/Σs²) of each head's token-to-token circuit, from factors shared by every head (no "
        "vocabulary-sized matrix is built); for OV, the copying score Re(Σλ)/Σ|λ| of the copying section.</p>"
    )
    return "".join(parts)
