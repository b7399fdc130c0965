"""Each model's header: its shape, where it came from and how it was trained."""

from __future__ import annotations

from qkov.report.svg import esc
from qkov.results import Results

SOURCES = {
    "qkov": "trained by qkov",
    "huggingface": "imported from Hugging Face",
    "transformer_lens": "imported from TransformerLens",
}


NORMALIZATIONS = {
    "none": "no LayerNorm",
    "LN": "LayerNorm (not folded)",
    "LNPre": "LayerNorm folded into the weights",
    "RMS": "RMSNorm (not folded)",
    "RMSPre": "RMSNorm folded into the weights",
}


def model_header(r: Results) -> str:
    """Where the model came from, its settings, and (for GPT-2-style models) what is exact."""
    cfg = r.config
    settings = ", ".join(f"{k} {v}" for k, v in cfg.to_dict().items())
    mlp = f"MLPs of {cfg.d_mlp} ({cfg.act_fn})" if cfg.d_mlp else "attention-only"
    source, norm = SOURCES.get(cfg.source, cfg.source), NORMALIZATIONS[cfg.normalization]
    head = f"<p><b>{esc(source)}</b>; {esc(norm)}; {esc(mlp)}.</p>"
    caveats = []
    if cfg.normalization != "none":
        caveats.append(
            "The weight-based analyses (copying, spectra, composition, skip-trigrams, the K-composition "
            "check) read the LayerNorm-folded weights: exact up to each position's positive LayerNorm scale."
        )
    if cfg.d_mlp:
        caveats.append(
            "With MLPs they cover the direct path through each head only (no MLP, MLP0 included); path "
            "expansion and term importance stay exact, each MLP's write a frozen term; head scores, "
            "ablations and losses come from the model's own run."
        )
    caveats += [note[0].upper() + note[1:] + "." for note in r.circuit_notes]
    return (
        head
        + "".join(f"<p class='small'>{esc(caveat)}</p>" for caveat in caveats)
        + f"<p class='small'>{esc(settings)}</p>"
    )
