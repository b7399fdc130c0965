"""Ablations rerun exactly: each earlier head's effect on later heads and on the loss."""

from __future__ import annotations

from qkov.circuits.ablation import MEANINGS
from qkov.names import parse_head
from qkov.report.markup import figure
from qkov.report.svg import esc, heatmap
from qkov.results import Results


def ablation_section(r: Results) -> str:
    effects = r.ablation
    if not effects:
        return ""
    later = sorted({name for e in effects for name in e.induction_change}, key=parse_head)
    rows = [f"{e.head} ({e.mode})" for e in effects]
    induction = [[e.induction_change.get(name) for name in later] for e in effects]
    loss = [[e.loss_change[-1]] for e in effects]
    every = 2 * r.config.n_heads * (r.config.n_layers - 1)  # both modes, every head read by a later layer
    rerun = (
        "every ablation rerun exactly"
        if len(effects) == every
        else f"exact reruns of the {len(effects)} of {every} ablations the first-order estimate ranks "
        "highest (below)"
    )
    charts = heatmap(
        induction, rows, later, 1.0, label="ablation effects", scale="induction change"
    ) + heatmap(loss, rows, ["loss, last repeat"], label="ablation loss change", scale="loss change (nats)")
    return figure(
        f"<div class='grid'>{charts}</div>",
        "Left: change in each later head's induction score (from -1 to +1, the scale's ends); right: "
        "change in the loss on the last repeat (nats, its own scale), when an earlier head's write is "
        f"ablated ({ablation_modes(e.mode for e in effects)}), on "
        f"{effects[0].sequences} sequence(s) of random tokens repeating every {effects[0].period} "
        f"positions: {rerun}. Red: the score or the loss rises; blue: it falls.",
        "ablating the previous-token head breaks the induction heads.",
    )


def ablation_modes(modes) -> str:
    """What each ablation mode used means, in the order first used: ``zero: replaced by zero ...``."""
    return "; ".join(f"{esc(mode)}: {MEANINGS.get(mode, mode)}" for mode in dict.fromkeys(modes))
