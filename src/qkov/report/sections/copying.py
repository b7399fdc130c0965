"""Copying: the OV eigenvalue copying score against its random baseline, the direct measures,
and the two compared."""

from __future__ import annotations

from qkov.report.markup import Num, figure, table
from qkov.report.sections.common import BLUE, GREEN, PURPLE, RED
from qkov.report.svg import esc, scatter
from qkov.results import Results


def _eigenvalue_plot(name: str, score: float | None, eigenvalues: list[tuple[float, float]]) -> str:
    limit = max((abs(complex(re, im)) for re, im in eigenvalues), default=1.0) or 1.0
    points = [
        {"x": re, "y": im, "label": f"{re:+.3g}{im:+.3g}i", "colour": GREEN if re >= 0 else PURPLE}
        for re, im in eigenvalues
    ]
    plot = scatter(
        points, "Re λ", "Im λ", (-limit, limit), (-limit, limit), f"eigenvalues of {name}", 220, 200, 2.5
    )
    score_text = "undefined" if score is None else f"{score:+.2f}"
    return f"<div><div class='small'>{esc(name)}: score {score_text}</div>{plot}</div>"


def copying_section(r: Results) -> str:
    copying = r.copying
    if copying is None:
        return ""
    plots = "".join(_eigenvalue_plot(h.name, h.copying_score, h.eigenvalues) for h in copying.heads)
    points = [{"x": x, "y": 0.0, "label": f"random: {x:+.3f}", "colour": "#999999"} for x in copying.baseline]
    for i, h in enumerate(h for h in copying.heads if h.copying_score is not None):
        colour = RED if h.copies else BLUE
        label = f"{h.name}: {h.copying_score:+.3f}"  # staggered rows keep close scores readable
        points.append(
            {"x": h.copying_score, "y": 0.8 + 0.2 * (i % 3), "label": label, "text": h.name, "colour": colour}
        )
    x_label = "copying score (0: random, 1: heads; red: above the 99th percentile)"
    against = scatter(
        points, x_label, "", (-1, 1), (-0.5, 1.5), "copying scores against the random baseline", 700, 180,
        marks=[(copying.threshold, "99th percentile of random")],
    )  # fmt: skip
    caption = (
        "Top: each head's copying score (row 1) against the scores of random matrices of the same shapes "
        "(row 0; red: above the 99th percentile, blue: below it). Below: eigenvalues of each head's full "
        "OV circuit W_E W_V W_O W_U (green: positive real part, copying; purple: negative). "
        f"{copying.copying_heads} of {len(copying.heads)} heads score above {copying.threshold:+.2f}, the "
        f"99th percentile of random matrices of the same shapes (mean {copying.baseline_mean:+.2f})."
    )
    claim = "most one-layer heads copy: their OV eigenvalues are mostly positive (10 of 12 heads)."
    return figure(against + f"<div class='grid'>{plots}</div>", caption, claim)


def copying_direct_section(r: Results) -> str:
    rows = r.copying_direct
    if not rows:
        return ""

    def top1(d) -> Num:
        return Num(
            f"{d.self_top1:.3f}"
            + ("" if d.self_top1_ci is None else " [{:.3f}, {:.3f}]".format(*d.self_top1_ci))
        )

    def mean(value: float, se: float | None) -> float | Num:
        return value if se is None else Num(f"{value:.3f} ± {se:.3f}")

    header = ["head", "diagonal mean", "diagonal z", "median self rank", "self is top logit", "rows ranked"]
    cells = [
        [
            d.name,
            mean(d.diagonal_mean, d.diagonal_mean_se),
            mean(d.diagonal_z, d.diagonal_z_se),
            d.self_rank_median,
            top1(d),
            f"{d.rows}{'' if d.exact else ' (sample)'}",
        ]
        for d in rows
    ]
    first = rows[0]
    sampled = (
        ""
        if first.exact
        else f" The rank and top-logit columns come from {first.rows} rows drawn at random, each exact, "
        "with 95% Wilson intervals."
    ) + (
        ""
        if first.diagonal_rows is None
        else f" The diagonal columns are means over {first.diagonal_rows} tokens drawn at random, each "
        "exact, ± one standard error."
    )
    return (
        "<h3>Direct copying measures</h3>"
        + table(header, cells)
        + "<p class='small'>Each token's effect on its own logit through the head's full OV circuit: the "
        "diagonal, its z-score within the row, the token's rank among all outputs of its row, and how "
        f"often it is the row's maximum.{sampled}</p>"
    )


def copying_comparison_section(r: Results) -> str:
    rows = r.copying_comparison
    if not rows or r.copying is None or r.copying_direct is None:
        return ""
    scores = {h.name: h.copying_score or 0.0 for h in r.copying.heads}
    z = {d.name: d.diagonal_z for d in r.copying_direct}
    points = [
        {"x": scores[c.name], "y": z[c.name], "text": c.name, "colour": RED if c.disagree else BLUE,
         "label": f"{c.name}: eigenvalue score {scores[c.name]:+.2f}, diagonal z {z[c.name]:+.2f}"}
        for c in rows
    ]  # fmt: skip
    top = max(max(abs(v) for v in z.values()), 1.0) * 1.1
    plot = scatter(
        points,
        "eigenvalue copying score",
        "diagonal z-score",
        (-1, 1),
        (-top, top),
        "eigenvalues against direct copying",
    )
    disagree = [c for c in rows if c.disagree]
    listed = ", ".join(
        f"{c.name} (eigenvalues: {'copying' if c.eigenvalues_say_copying else 'not'}, direct: "
        f"{'copying' if c.direct_says_copying else 'not'})"
        for c in disagree
    )
    return figure(
        plot,
        f"Each head's eigenvalue copying score against the z-score of its own-logit effect (red: the two "
        f"verdicts of compare_copying disagree). Heads where they disagree: {listed or 'none'}.",
        "the eigenvalue statistic summarises copying; whether it is a reliable test is one of the paper's "
        "open questions.",
    )
