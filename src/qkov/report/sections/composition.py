"""Q-, K- and V-composition scores, on one colour scale, with the random baseline."""

from __future__ import annotations

from qkov.names import parse_head
from qkov.report.markup import figure
from qkov.report.svg import heatmap, shared_limit
from qkov.results import Results


def composition_section(r: Results) -> str:
    composition = r.composition
    if composition is None:
        return ""
    grids = {}
    for kind, pairs in (("Q", composition.Q), ("K", composition.K), ("V", composition.V)):
        writers = sorted({p.writer for p in pairs}, key=parse_head)
        readers = sorted({p.reader for p in pairs}, key=parse_head)
        for title, value in (("baseline subtracted", lambda p: p.score), ("raw", lambda p: p.raw)):
            grid = {(p.writer, p.reader): value(p) for p in pairs}
            grids[kind, title] = (writers, readers, [[grid.get((w, rd)) for rd in readers] for w in writers])
    limit = shared_limit(*(values for _, _, values in grids.values()))  # one scale for all six
    figures = []
    for (kind, title), (writers, readers, values) in grids.items():
        baseline = composition.baseline if title == "raw" else 0.0
        chart = heatmap(
            values, writers, readers, limit, label=f"{kind}-composition {title}", scale=f"{kind} {title}",
            marks=[(baseline, "random")],
        )  # fmt: skip
        figures.append(f"<div><div class='small'>{kind}-composition, {title}</div>{chart}</div>")
    return figure(
        f"<div class='grid'>{''.join(figures)}</div>",
        "Composition scores, rows: earlier head, columns: later head; one colour scale for the six maps "
        f"(red above zero, blue below, saturating at ±{limit:.3g}). The baseline "
        f"({composition.baseline:.3f}, dashed 'random' on each colour bar: 0 once subtracted) is the "
        "expected score of random heads of the same shapes; TransformerLens reports the raw score.",
        "only K-composition with the previous-token head stands out (the corrected paper adds that the "
        "Q- and V-composition seen earlier came from a bug in its low-rank library).",
    )
