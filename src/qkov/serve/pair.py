"""Views of two heads in different layers (sections "Three Kinds of Composition", "Virtual
Weights" and "How Induction Heads Work"): their Q-, K- and V-composition scores against the random
baseline, the strongest directions of the virtual weight through which one feeds the other, and the
K-composition induction check (the eigenvalue positivity of the token-level K-composition
circuit), all from the functions ``qkov analyze`` calls; and the pairs of a kind strongest first,
filtered by the writer's and the reader's layer and paged, which a model of many heads is read by.
"""

from __future__ import annotations

import math
from dataclasses import asdict

import torch

from qkov.circuits.composition import (
    KINDS,
    all_raw_composition_scores,
    composition_baseline,
    k_composition_positivity,
    strongest_pairs,
)
from qkov.circuits.paths import virtual_weights
from qkov.errors import QkovError
from qkov.serve.explorer import Explorer
from qkov.serve.jobs import Progress

PARTNER = {"K": "W_Q", "Q": "W_K"}  # what meets a key (query) direction in the reader's attention score
PAGE_MAX = 100  # pairs in one page of the strongest
DIRECTIONS = 3  # singular directions of a virtual weight shown: the rest are usually near zero


def composition_scores(ex: Explorer, progress: Progress) -> dict:
    """Raw Q/K/V composition scores of every pair and the baseline (kept on the explorer, computed
    once)."""
    progress.step(0, 1, "composition scores of every pair")
    return {
        "raw": all_raw_composition_scores(ex.circuit, KINDS),
        "baseline": composition_baseline(ex.cfg.d_model, ex.cfg.d_head),
    }


def composition_tables(ex: Explorer, progress: Progress) -> dict:
    """:func:`composition_scores` and the K-composition positivity, as tensors (kept on the
    explorer, computed once)."""
    scores = ex.once("composition_scores", lambda: composition_scores(ex, progress))
    progress.step(1, 2, "K-composition circuits' eigenvalues")
    return scores | {"positivity": k_composition_positivity(ex.circuit)}


def check_pairs_page(
    ex: Explorer, writer_layer: int | None, reader_layer: int | None, offset: int, limit: int
) -> None:
    """Refuse, in one line, a page of pairs that cannot be: a model of one layer, a layer it does
    not have, a negative offset or a page of fewer than 1 or more than :data:`PAGE_MAX` pairs."""
    n_layers = ex.cfg.n_layers
    if n_layers < 2:
        raise QkovError("no composition: heads compose only across two layers or more")
    for name, layer in (("writer_layer", writer_layer), ("reader_layer", reader_layer)):
        if layer is not None and not 0 <= layer < n_layers:
            raise QkovError(f"{name}={layer} out of range: the model has layers 0 to {n_layers - 1}")
    if offset < 0 or not 1 <= limit <= PAGE_MAX:
        raise QkovError(f"offset={offset}, limit={limit}: a page starts at 0 or after, holds 1 to {PAGE_MAX}")


def strongest_view(
    scores: dict, kind: str, writer_layer: int | None, reader_layer: int | None, offset: int, limit: int
) -> dict:
    """One page of the pairs of ``kind``, strongest first (:func:`strongest_pairs`), of those whose
    writer and reader are in the layers given (any, when None), and how many there are: the list a
    model of many heads is read by, instead of a map of every pair."""
    pairs, total = strongest_pairs(
        scores["raw"][kind], scores["baseline"], limit, writer_layer, reader_layer, offset
    )
    return {
        "kind": kind, "writer_layer": writer_layer, "reader_layer": reader_layer, "offset": offset,
        "total": total, "baseline": scores["baseline"], "pairs": [asdict(p) for p in pairs],
    }  # fmt: skip


def _ends(ex: Explorer, values: torch.Tensor, k: int, outputs: bool = False) -> dict:
    """The ``k`` largest and smallest entries of ``values``, tokens or (``outputs``) the model's
    outputs, of which a classifier has fewer than ``k``: then all of them."""
    k = min(k, len(values))
    top, bottom = values.topk(k), values.topk(k, largest=False)
    listed = ex.outputs_listed if outputs else ex.listed
    return {
        "positive": listed(top.indices.tolist(), top.values.tolist()),
        "negative": listed(bottom.indices.tolist(), bottom.values.tolist()),
    }


def virtual_directions(ex: Explorer, writer: str, reader: str, kind: str, k: int) -> dict:
    """The singular values of the virtual weight ``W_O^writer W_kind^reader`` (``[d_head,
    d_head]``, row-vector form; the paper's ``W_kind^2 W_O^1``) and, for its strongest directions,
    the tokens at either end: on the writer's side the source tokens it moves along the direction
    (``W_E W_V u``, direct path); on the reader's side, for K-composition the destination tokens
    whose queries look for that key (``W_E W_Q v``), for Q-composition the source tokens whose keys
    answer that query (``W_E W_K v``), for V-composition the logits it then writes (``v W_O W_U``).
    Singular vectors have no sign of their own: a writer token at the positive end composes
    positively with a reader token at the positive end (and negative with negative).

    Everything is read from :attr:`Explorer.circuit`, the weights the virtual weight itself comes
    from: with LayerNorm, its weight folded into ``W_Q``, ``W_K``, ``W_V`` and ``W_U``, and the
    logits centred over the vocabulary (:mod:`qkov.interop.fold`)."""
    (l1, h1), (l2, h2) = ex.pair(writer, reader)
    model = ex.circuit  # the virtual weight and its token ends from the same (folded) weights
    with torch.no_grad():
        U, S, Vh = virtual_weights(model, writer, f"{reader}.{kind}").svd()
        writer_tokens = model.W_E @ model.blocks[l1].attn.W_V[h1]  # [d_vocab, d_head]
        attn2 = model.blocks[l2].attn
        directions = []
        for i in range(min(DIRECTIONS, len(S))):
            u, v = U[:, i], Vh[i]
            if kind == "V":
                reads = v @ attn2.W_O[h2] @ model.W_U
            else:  # the other side of the dot product: queries meet a key direction, keys a query's
                reads = model.W_E @ (getattr(attn2, PARTNER[kind])[h2] @ v)
            directions.append(
                {
                    "singular_value": float(S[i]),
                    "writer": _ends(ex, writer_tokens @ u, k),
                    "reader": _ends(ex, reads, k, outputs=kind == "V"),
                }
            )
    return {"singular_values": [float(s) for s in S], "directions": directions}


def pair_view(ex: Explorer, tables: dict, writer: str, reader: str, kind: str, k: int) -> dict:
    """Composition of ``writer`` into ``reader`` of every kind (raw, baseline subtracted), the
    K-composition positivity, and the chosen kind's virtual-weight directions."""
    if kind not in KINDS:
        raise QkovError(f"kind must be one of Q, K, V, got {kind!r}")
    (l1, h1), (l2, h2) = ex.pair(writer, reader)
    baseline = tables["baseline"]
    scores = {}
    for name in KINDS:
        raw = float(tables["raw"][name][l1, h1, l2, h2])
        scores[name] = {"raw": raw, "baseline": baseline, "score": raw - baseline}
    positivity = float(tables["positivity"][l1, h1, l2, h2])
    return {
        "writer": writer,
        "reader": reader,
        "kind": kind,
        "composition": scores,
        "k_composition_positivity": None if math.isnan(positivity) else positivity,
        "virtual_weight": virtual_directions(ex, writer, reader, kind, k),
    }
