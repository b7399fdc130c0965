"""Every head's previous-token, induction and duplicate-token scores on repeated random tokens."""

from __future__ import annotations

from qkov.report.markup import table
from qkov.results import Results


def heads_section(r: Results) -> str:
    """Every head's scores side by side, from the copying, direct copying and repeated-token results."""
    if r.copying is None or r.copying_direct is None or r.repeated_tokens is None:
        return ""
    header = ["head", "OV copying (eigenvalues)", "self is top logit", "diagonal z"]
    header += ["previous-token", "induction", "duplicate-token"]
    heads = zip(r.copying.heads, r.copying_direct, r.repeated_tokens.heads, strict=True)
    rows = [
        [copying.name, copying.copying_score, direct.self_top1, direct.diagonal_z]
        + [behaviour.previous_token_score, behaviour.induction_score, behaviour.duplicate_token_score]
        for copying, direct, behaviour in heads
    ]
    repeated = r.repeated_tokens
    losses = " / ".join(f"{x:.2f}" for x in repeated.loss_per_repeat)
    return (
        "<h3>Heads</h3>"
        + table(header, rows)
        + f"<p>Loss on {repeated.sequences} sequences of {repeated.period} random tokens repeated "
        f"{repeated.repeats} times, per repeat: {losses} nats.</p>"
    )
