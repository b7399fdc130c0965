"""Q-, K- and V-composition scores, on one colour scale, with the random baseline.

Up to :data:`HEAD_MAPS_MAX` heads, every pair is drawn: six maps of earlier head x later head. Beyond
(a model of 1,024 heads would have 1,024 x 1,024 cells per map), the section draws what
``Composition`` keeps for a reader: each kind's strongest score between each two layers (a map of
layer x layer) and its strongest pairs as a table; every pair's scores stay in ``results.json``'s
sidecar (:mod:`qkov.sidecar`), read with :func:`qkov.load_results`.
"""

from __future__ import annotations

from qkov.circuits.composition import Composition, CompositionPair
from qkov.names import parse_head
from qkov.report.markup import figure, table
from qkov.report.svg import heatmap, shared_limit
from qkov.results import Results

HEAD_MAPS_MAX = 64  # heads, beyond which the maps are per layer and the pairs a table of the strongest
LAYER_MAP_WIDTH = 420  # pixels: the cells of a layer x layer map shrink to fit it (8 to 36 pixels)
KIND_ROWS = (("Q", "Q-composition"), ("K", "K-composition"), ("V", "V-composition"))
CLAIM = (
    "only K-composition with the previous-token head stands out (the corrected paper adds that the "
    "Q- and V-composition seen earlier came from a bug in its low-rank library)."
)


def composition_section(r: Results) -> str:
    composition = r.composition
    if composition is None:
        return ""
    if heads_and_layers(composition)[0] > HEAD_MAPS_MAX:
        return many_heads_section(composition)
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
        CLAIM,
    )


def heads_and_layers(composition: Composition) -> tuple[int, int]:
    """How many heads and layers the pairs name (every head writes into a later layer or reads an
    earlier one), from the result alone: a section reads its own field only (a notebook shows a
    ``Composition`` without the rest of the results)."""
    heads = {name for pair in composition.K for name in (pair.writer, pair.reader)}
    layers = {parse_head(name)[0] for name in heads}
    return len(heads), max(layers, default=-1) + 1


def many_heads_section(composition: Composition) -> str:
    """A model of more than :data:`HEAD_MAPS_MAX` heads: a layer x layer map of each kind's strongest
    score, and each kind's strongest pairs (module docstring)."""
    heads, n_layers = heads_and_layers(composition)
    shown = (
        f"This model has {heads:,} heads: instead of {heads:,} x {heads:,} maps of every pair, this section "
        "shows, for each kind, the strongest score from any head of one layer into any head of another, "
        "and the strongest pairs."
    )
    where = (
        " Every pair's scores are in results.json's sidecar, results.arrays.safetensors "
        "(qkov.load_results reads them; qkov serve lists them by layer)."
    )
    if not composition.layers or not composition.top:
        return figure(
            "<p>This results.json keeps no per-layer maxima or strongest pairs (it was written before qkov "
            "kept them): analyze the model again to see them here.</p>",
            shown + where,
        )
    limit = shared_limit(*composition.layers.values())
    cell = max(8, min(36, LAYER_MAP_WIDTH // max(n_layers, 1)))
    layers = [f"layer {layer}" for layer in range(n_layers)]
    maps = [
        f"<div><div class='small'>{title}, strongest per layer pair</div>"
        + heatmap(composition.layers[kind], layers, layers, limit, cell=cell, label=f"{title} by layer",
                  scale=f"{kind} baseline subtracted")
        + "</div>"
        for kind, title in KIND_ROWS
        if kind in composition.layers
    ]  # fmt: skip
    every = (composition.Q, composition.K, composition.V)
    tables = [
        f"<div><div class='small'>{title}: the {len(pairs)} strongest of {len(all_pairs):,} pairs</div>"
        + strongest_table(pairs, composition.baseline_sd)
        + "</div>"
        for (kind, title), all_pairs in zip(KIND_ROWS, every, strict=True)
        if (pairs := composition.top.get(kind))
    ]
    return figure(
        f"<p>{shown}</p><div class='grid'>{''.join(maps)}</div><div class='grid'>{''.join(tables)}</div>",
        shown + " Maps: rows the earlier layer, columns the later one, one colour scale for the three "
        f"(red above zero, blue below, saturating at ±{limit:.3g}), scores less the baseline "
        f"({composition.baseline:.3f}), the expected score of random heads of the same shapes; tables: "
        "the pairs of highest score, TransformerLens' raw score beside it." + where,
        CLAIM,
    )


def strongest_table(pairs: list[CompositionPair], sd: float | None) -> str:
    """Writer, reader, score less the baseline (and in the random scores' standard deviations), raw."""
    header = ["writer", "reader", "score", "random SDs", "raw"]
    rows = [[p.writer, p.reader, p.score, None if not sd else f"{p.score / sd:+.1f}", p.raw] for p in pairs]
    return table(header, rows)
