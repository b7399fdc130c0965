"""Path expansion: how much of the loss each order of terms, and each head, carries."""

from __future__ import annotations

from qkov.names import head_name
from qkov.report.markup import figure
from qkov.report.svg import bars
from qkov.results import Results


def term_importance_section(r: Results) -> str:
    importance = r.term_importance
    if importance is None:
        return ""
    order_bars = [(f"order {n + 1}", m) for n, m in enumerate(importance.marginal)]
    head_bars = [
        (head_name(layer, head), v)
        for layer, row in enumerate(importance.first_order_by_head)
        for head, v in enumerate(row)
    ]
    losses = ", ".join(f"order ≤ {n}: {v:.3f}" for n, v in enumerate(importance.loss_by_order))
    charts = bars(
        order_bars, "loss reduction (nats) when the paths of this order are added", "term importance by order"
    ) + bars(head_bars, "loss reduction of each head's first-order term alone", "first-order terms by head")
    return figure(
        charts,
        f"Term importance on {importance.tokens}: loss with paths up to each order kept ({losses}).",
        "the direct path and first-order terms carry most of the loss reduction; virtual heads (second "
        "order) matter little.",
    )
