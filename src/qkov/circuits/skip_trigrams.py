"""Skip-trigram tables and their "bugs" (section "One-Layer Attention-Only Transformers").

A first-layer head implements skip-trigrams ``[source] ... [destination] -> [out]``: at a
``destination`` token it attends back to a ``source`` token (its QK circuit, destination x
source) and raises the logit of ``out`` (its OV circuit, source -> out). Both circuits are read
from the full token-level circuits, centred so that only what moves the softmax counts: each QK
row (one destination) minus its mean over sources, each OV row (one source) minus its mean over
outputs. A skip-trigram's *strength* is ``qk * ov`` where both are positive.

Because the strength factors through the source, the ``k`` strongest triples are found exactly
among, for every source, its ``k`` best destinations times its ``k`` best outputs: a
``d_vocab x k x k`` candidate set, streamed in blocks of sources, never ``d_vocab^3``.

The same factorisation is the "bug": ``f(a, b, c) = qk(b, a) ov(a, c)``, so strong ``(a, b1, c1)``
and ``(a, b2, c2)`` force ``(a, b1, c2)`` and ``(a, b2, c1)`` to be about as strong.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from functools import cached_property
from typing import NamedTuple

import numpy as np
import torch
from jaxtyping import Bool
from torch import Tensor

from qkov.circuits.qk_ov import full_ov_circuit, full_qk_circuit
from qkov.errors import QkovError
from qkov.linalg import FactoredMatrix
from qkov.model import AttnOnlyTransformer
from qkov.names import head_name
from qkov.topk import row_max_bounds, screened_row_max_bounds

SOURCE_BLOCK = 1024
EXHAUSTIVE_TOKENS = 8192  # up to here every source is searched (2 n^2 d_head products: under a second)
PRUNE_BLOCK = 256  # sources whose triples are found exactly at once
SCREENED_FRACTION = 0.1  # the leaves' bounds leave more sources than this: screen the maxima


@dataclass(frozen=True)
class SkipTrigram:
    source: int
    destination: int
    out: int
    qk: float
    ov: float
    strength: float


def _centred(fm: FactoredMatrix) -> FactoredMatrix:
    """Each row minus its mean (still factored: ``A (B - mean_cols B)``)."""
    return FactoredMatrix(fm.A, fm.B - fm.B.mean(-1, keepdim=True))


@dataclass(frozen=True)
class HeadCircuits:
    """One head's centred token-level circuits, over the vocabulary subset ``tokens``."""

    qk: FactoredMatrix  # [destination, source]
    ov: FactoredMatrix  # [source, out]
    tokens: Tensor  # the token id of each row/column

    @cached_property
    def _position(self) -> dict[int, int]:
        return {int(t): i for i, t in enumerate(self.tokens)}

    def strength(self, source: int, destination: int, out: int) -> tuple[float, float]:
        """``(qk, ov)`` of one triple, given as token ids."""
        row = self._position
        return float(self.qk[row[destination], row[source]]), float(self.ov[row[source], row[out]])


def head_circuits(
    model: AttnOnlyTransformer, layer: int, head: int, allowed: Bool[Tensor, "d_vocab"] | None = None
) -> HeadCircuits:
    with torch.no_grad():
        tokens = _allowed_tokens(model, allowed)
        return _circuits_of(full_qk_circuit(model)[layer, head], full_ov_circuit(model)[layer, head], tokens)


def _allowed_tokens(model: AttnOnlyTransformer, allowed: Bool[Tensor, "d_vocab"] | None) -> Tensor:
    every = torch.arange(model.cfg.d_vocab, device=model.device)
    tokens = every if allowed is None else allowed.to(model.device).nonzero().squeeze(1)
    if tokens.numel() == 0:
        raise QkovError("no tokens left to search for skip-trigrams")
    return tokens


def _circuits_of(qk: FactoredMatrix, ov: FactoredMatrix, tokens: Tensor) -> HeadCircuits:
    """One head's circuits over ``tokens``, in float64, centred."""
    qk, ov = qk.to(torch.float64), ov.to(torch.float64)
    qk = FactoredMatrix(qk.A[tokens], qk.B[:, tokens])
    ov = FactoredMatrix(ov.A[tokens], ov.B[:, tokens])
    return HeadCircuits(_centred(qk), _centred(ov), tokens)


class _Candidates(NamedTuple):
    """Candidate triples as row/column positions of :class:`HeadCircuits`, with their ``qk`` and
    ``ov``; the fields broadcast together to the candidates' shape (a block of sources times
    each source's best destinations and outputs, say)."""

    source: Tensor
    destination: Tensor
    out: Tensor
    qk: Tensor
    ov: Tensor

    def strongest(self, k: int) -> _Candidates:
        """The ``k`` strongest, as 1-D fields, strongest first. A candidate whose ``qk`` or ``ov``
        is not positive has strength ``-inf``: kept, and dropped only at the end (so that a
        merge sees the same values in the same places as one search over every block would)."""
        shape = torch.broadcast_shapes(*(field.shape for field in self))
        strength = (self.qk * self.ov).masked_fill((self.qk <= 0) | (self.ov <= 0), -torch.inf)
        index = strength.expand(shape).flatten().topk(min(k, math.prod(shape))).indices
        where = torch.unravel_index(index, shape)
        return _Candidates(*(field.expand(shape)[where] for field in self))


def _merged(best: _Candidates | None, block: _Candidates, k: int) -> _Candidates:
    """The ``k`` strongest of ``best`` (None before the first block) and ``block``'s own best."""
    found = block.strongest(k)
    if best is None:
        best = _Candidates(*(field.new_empty(0) for field in found))
    return _Candidates(*map(torch.cat, zip(best, found, strict=True))).strongest(k)


def _trigrams(circuits: HeadCircuits, best: _Candidates | None) -> list[SkipTrigram]:
    """The positive candidates of ``best`` (strongest first) as skip-trigrams of token ids."""
    if best is None:
        return []
    tokens, trigrams = circuits.tokens, []
    for source, destination, out, qk, ov in zip(*(field.tolist() for field in best), strict=True):
        if qk <= 0 or ov <= 0:
            break
        triple = (int(tokens[source]), int(tokens[destination]), int(tokens[out]))
        trigrams.append(SkipTrigram(*triple, qk=qk, ov=ov, strength=qk * ov))
    return trigrams


def _strongest_of(circuits: HeadCircuits, blocks: Iterable[_Candidates], k: int) -> list[SkipTrigram]:
    """The ``k`` strongest of all the blocks' candidates (each block's best merged into the best so
    far, so one block at a time is in memory), as skip-trigrams of token ids."""
    best = None
    for block in blocks:
        best = _merged(best, block, k)
    return _trigrams(circuits, best)


def _source_candidates(circuits: HeadCircuits, sources: Tensor, per_source: int) -> _Candidates:
    """Each of ``sources``' ``per_source`` best destinations times its best outputs, exactly (its
    column of the QK circuit and its row of the OV circuit, in the circuits' dtype)."""
    qk = circuits.qk.T
    qk_values, dests = FactoredMatrix(qk.A[sources], qk.B).topk_per_row(per_source)
    ov_values, outs = FactoredMatrix(circuits.ov.A[sources], circuits.ov.B).topk_per_row(per_source)
    return _Candidates(
        sources[:, None, None],
        dests[:, :, None],
        outs[:, None, :],
        qk_values[:, :, None],
        ov_values[:, None, :],
    )


def _strength_bound(qk_max: Tensor, ov_max: Tensor) -> Tensor:
    """A bound on a source's strongest triple from bounds on its QK column's and OV row's maxima;
    ``-inf`` where either is not positive (no positive triple)."""
    positive = (qk_max > 0) & (ov_max > 0)
    return torch.where(positive, qk_max * ov_max, -math.inf)


def _tightened(circuits: HeadCircuits, bounds: Tensor, tau: float) -> Tensor:
    """``bounds`` (from the leaves' boxes), or where they leave more than :data:`SCREENED_FRACTION`
    of the sources at or above ``tau``, the tighter bounds from the screened maxima (one pass over
    both circuits, in float32 or in bfloat16 where that pays: the exhaustive search's matmuls,
    without its top-k; :func:`qkov.topk.screened_row_max_bounds`)."""
    if float((bounds >= tau).double().mean()) <= SCREENED_FRACTION:
        return bounds
    qk, ov = circuits.qk.T, circuits.ov
    screened = _strength_bound(screened_row_max_bounds(qk.A, qk.B), screened_row_max_bounds(ov.A, ov.B))
    return screened.minimum(bounds)


@torch.no_grad()
def strongest_skip_trigrams(circuits: HeadCircuits, k: int = 50) -> list[SkipTrigram]:
    """The ``k`` strongest skip-trigrams of one head, strongest first (exact; see the module
    docstring), without searching most sources: the sources of the highest bounds on their strongest
    triple (:func:`qkov.topk.row_max_bounds` of both circuits) searched first for a ``k``-th best
    strength ``tau``; then the rest in order of their bounds (:func:`_tightened`),
    :data:`PRUNE_BLOCK` at a time, each block's triples found exactly, until the next bound falls
    below the ``tau`` held: no triple of the sources left can enter the table, nor tie with its end.

    Ties: equal strengths are ordered as ``torch.topk`` orders them among the candidates merged,
    so of equal-strength triples at the table's end another may be kept than the exhaustive search
    kept; the strengths are the same. Up to :data:`EXHAUSTIVE_TOKENS` tokens every source is
    searched, in blocks of :data:`SOURCE_BLOCK` (:func:`_exhaustive`), which keeps that search's
    order among equal strengths."""
    n, per_source = len(circuits.tokens), min(k, len(circuits.tokens))
    if n <= EXHAUSTIVE_TOKENS:
        return _exhaustive(circuits, k)
    qk, ov = circuits.qk.T, circuits.ov
    bounds = _strength_bound(row_max_bounds(qk.A, qk.B), row_max_bounds(ov.A, ov.B))
    opening = bounds.argsort(descending=True)[:PRUNE_BLOCK]
    best = _merged(None, _source_candidates(circuits, opening, per_source), k)
    bounds = _tightened(circuits, bounds, _tau(best, k))
    bounds[opening] = -math.inf
    order = bounds.argsort(descending=True)
    for start in range(0, n, PRUNE_BLOCK):
        block = order[start : start + PRUNE_BLOCK]
        block = block[(bounds[block] >= _tau(best, k)) & (bounds[block] > -math.inf)]
        if block.numel() == 0:
            break  # the bounds are in descending order: every later source's is lower still
        best = _merged(best, _source_candidates(circuits, block, per_source), k)
    return _trigrams(circuits, best)


def _exhaustive(circuits: HeadCircuits, k: int) -> list[SkipTrigram]:
    """Every source's ``k`` best destinations times its ``k`` best outputs, the ``k`` strongest."""
    n = len(circuits.tokens)
    per_source = min(k, n)
    qk_values, dests = circuits.qk.T.topk_per_row(per_source)  # [source, per_source]
    ov_values, outs = circuits.ov.topk_per_row(per_source)
    sources = torch.arange(n, device=qk_values.device)
    blocks = (
        _Candidates(
            sources[start:end, None, None],
            dests[start:end, :, None],
            outs[start:end, None, :],
            qk_values[start:end, :, None],
            ov_values[start:end, None, :],
        )
        for start, end in _source_blocks(n)
    )
    return _strongest_of(circuits, blocks, k)


def _source_blocks(n: int) -> list[tuple[int, int]]:
    return [(start, min(start + SOURCE_BLOCK, n)) for start in range(0, n, SOURCE_BLOCK)]


def _tau(best: _Candidates, k: int) -> float:
    """The ``k``-th best positive strength held, ``-inf`` before ``k`` are."""
    positive = (best.qk > 0) & (best.ov > 0)
    if int(positive.sum()) < k:
        return -math.inf
    return float((best.qk * best.ov)[positive].min())


def check_through(source: int | None, destination: int | None) -> None:
    """Refuse anything but exactly one of ``source`` and ``destination`` (see
    :func:`skip_trigrams_through`)."""
    if (source is None) == (destination is None):
        raise QkovError("give exactly one of source and destination")


def _row(circuits: HeadCircuits, token: int) -> int:
    """The row (and column) of ``token`` in the circuits."""
    try:
        return circuits._position[token]
    except KeyError:
        raise QkovError(f"token {token} is not among the tokens searched for skip-trigrams") from None


@torch.no_grad()
def skip_trigrams_through(
    circuits: HeadCircuits,
    source: int | None = None,
    destination: int | None = None,
    k: int = 10,
    progress: Callable[[int, int], None] | None = None,
) -> list[SkipTrigram]:
    """The ``k`` strongest skip-trigrams ``source ... destination -> out`` of one head through a
    given ``source`` or a given ``destination`` token (exactly one), strongest first: exact, as
    :func:`strongest_skip_trigrams` is.

    Through a source, the strength ``qk(destination, source) ov(source, out)`` is a product of a
    column of the QK circuit and a row of the OV circuit: the ``k`` best of each hold the answer.
    Through a destination, every source pairs one QK entry with its own best outputs, which are
    streamed in blocks of :data:`SOURCE_BLOCK` sources; ``progress(done, total)`` is called before
    each block (sources done of all sources), and may raise to stop the search."""
    check_through(source, destination)
    per = min(k, len(circuits.tokens))
    if source is not None:
        row = _row(circuits, source)
        qk, dests = circuits.qk[:, row].topk(per)  # the destinations that attend to the source most
        ov, outs = circuits.ov[row, :].topk(per)
        at = torch.tensor([[row]], device=dests.device)
        return _strongest_of(
            circuits, [_Candidates(at, dests[:, None], outs[None, :], qk[:, None], ov[None, :])], k
        )
    row = _row(circuits, destination)
    qk = circuits.qk[row, :]  # [source]: how much the destination attends to each source
    at = torch.tensor([[row]], device=qk.device)
    sources = torch.arange(len(qk), device=qk.device)

    def blocks() -> Iterator[_Candidates]:
        for start, end in _source_blocks(len(qk)):
            if progress is not None:
                progress(start, len(qk))
            ov, outs = circuits.ov[start:end, :].topk_per_row(per)  # [source, per]
            yield _Candidates(sources[start:end, None], at, outs, qk[start:end, None], ov)

    return _strongest_of(circuits, blocks(), k)


@dataclass(frozen=True)
class Crossed:
    """A skip-trigram forced by a bug: ``(source, destination) -> out``, its strength ``qk * ov``,
    and whether it occurs in a corpus (``None`` until checked against one)."""

    destination: int
    out: int
    strength: float
    in_corpus: bool | None = None


@dataclass(frozen=True)
class SkipTrigramBug:
    """Two strong skip-trigrams sharing a source, and the two crossed ones they force:
    ``(b1, c2)`` and ``(b2, c1)``."""

    source: int
    first: tuple[int, int]  # (destination, out) of one strong skip-trigram
    second: tuple[int, int]
    crossed: list[Crossed]


def skip_trigram_bugs(
    circuits: HeadCircuits, trigrams: list[SkipTrigram], limit: int = 10
) -> list[SkipTrigramBug]:
    """Pairs among ``trigrams`` with one source, different destinations and different outputs;
    the crossed combinations' strengths are read from the circuits. Strongest crossings first."""
    bugs = []
    for first, second in itertools.combinations(trigrams, 2):
        if (
            first.source != second.source
            or first.destination == second.destination
            or first.out == second.out
        ):
            continue
        crossed = []
        for dest, out in ((first.destination, second.out), (second.destination, first.out)):
            qk, ov = circuits.strength(first.source, dest, out)
            crossed.append(Crossed(dest, out, qk * ov))
        bugs.append(
            SkipTrigramBug(
                first.source, (first.destination, first.out), (second.destination, second.out), crossed
            )
        )
    bugs.sort(key=lambda bug: -min(c.strength for c in bug.crossed))
    return bugs[:limit]


def skip_trigram_occurs(
    tokens: np.ndarray, source: int, destination: int, out: int, window: int, chunk: int = 2**22
) -> bool:
    """Whether ``source`` occurs within ``window`` tokens before (or at) a ``destination`` that is
    followed by ``out`` anywhere in ``tokens``: the skip-trigram is in the corpus. ``tokens`` (an
    array, or any token sequence read in contiguous slices, such as a corpus' sharded tokens) is
    scanned ``chunk`` destinations at a time, each chunk read with the ``window - 1`` tokens before
    it and the one after: bounded memory, the answer of the whole sequence at once."""
    for start in range(0, len(tokens) - 1, chunk):
        low = max(0, start - max(window, 1) + 1)
        part = np.asarray(tokens[low : start + chunk + 1])
        hits = np.flatnonzero((part[:-1] == destination) & (part[1:] == out))
        hits = hits[hits >= start - low]  # the destinations before the chunk are the last chunk's
        if hits.size == 0:
            continue
        seen = np.concatenate([[0], np.cumsum(part == source)])  # seen[i]: occurrences in part[:i]
        if ((seen[hits + 1] - seen[np.maximum(hits + 1 - window, 0)]) > 0).any():
            return True
    return False


@dataclass(frozen=True)
class BugTerm:
    """One bugged term: head ``head``'s crossed skip-trigram ``source ... destination -> out``,
    its ``strength`` in the bug table, the centred OV entry ``ov`` subtracted per unit of attention,
    the number of held-out positions where it ``fires`` (the destination token, with the source
    among the earlier tokens it attends to), and what removing it alone saves in ``nats_per_token``."""

    head: str
    source: int
    destination: int
    out: int
    strength: float
    ov: float
    fires: int
    nats_per_token: float


@dataclass(frozen=True)
class BugCost:
    """What the bugged terms cost on ``tokens`` (see the module docstring), in nats per predicted
    token: all of them (``nats_per_token``), each head's (``by_head``), and the ``top`` costliest
    terms alone, costliest first. ``heads_gain`` is what the heads gain over the direct path (its
    loss minus the model's), ``head_gain`` what each head alone adds to the direct path; ``share``
    and ``share_by_head`` divide the costs by them (None where the gain is zero). ``terms``: the
    number of bugged terms; ``covers`` says which bugs are counted (the crossings among each head's
    strongest skip-trigrams only, so the cost is a lower bound on what every bug costs)."""

    nats_per_token: float
    by_head: dict[str, float]
    heads_gain: float
    head_gain: dict[str, float]
    share: float | None
    share_by_head: dict[str, float | None]
    terms: int
    top: list[BugTerm]
    tokens: str
    covers: str = ""


@dataclass(frozen=True)
class SkipTrigrams:
    """Every first-layer head's strongest skip-trigrams and the bugs they force, by head name (token
    ids: ``Results.tokens`` reads them), and, with held-out text, what the bugs that never occur in
    the corpus cost (:func:`qkov.circuits.bug_cost.bug_cost`; None otherwise)."""

    tables: dict[str, list[SkipTrigram]]
    bugs: dict[str, list[SkipTrigramBug]]
    bug_cost: BugCost | None = None


@torch.no_grad()
def skip_trigram_tables(
    model: AttnOnlyTransformer,
    k: int = 50,
    allowed: Bool[Tensor, "d_vocab"] | None = None,
    corpus: np.ndarray | None = None,
) -> SkipTrigrams:
    """Each first-layer head's ``k`` strongest skip-trigrams among the ``allowed`` tokens
    (:func:`strongest_skip_trigrams`) and the bugs they force (:func:`skip_trigram_bugs`); with a
    ``corpus`` (token ids), each crossed skip-trigram says whether it occurs there within the model's
    context (:func:`skip_trigram_occurs`)."""
    tables, bugs = {}, {}
    tokens = _allowed_tokens(model, allowed)
    qk, ov = full_qk_circuit(model)[0], full_ov_circuit(model)[0]  # every head's factors, built once
    for head in range(model.cfg.n_heads):
        circuits = _circuits_of(qk[head], ov[head], tokens)
        trigrams = strongest_skip_trigrams(circuits, k)
        found = skip_trigram_bugs(circuits, trigrams)
        if corpus is not None:
            found = [_checked(bug, corpus, model.cfg.n_ctx) for bug in found]
        tables[head_name(0, head)], bugs[head_name(0, head)] = trigrams, found
    return SkipTrigrams(tables, bugs)


def _checked(bug: SkipTrigramBug, corpus: np.ndarray, window: int) -> SkipTrigramBug:
    crossed = [
        replace(c, in_corpus=skip_trigram_occurs(corpus, bug.source, c.destination, c.out, window))
        for c in bug.crossed
    ]
    return replace(bug, crossed=crossed)
