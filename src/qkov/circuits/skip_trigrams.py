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
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch
from jaxtyping import Bool
from torch import Tensor

from qkov.circuits.qk_ov import full_ov_circuit, full_qk_circuit
from qkov.errors import QkovError
from qkov.linalg import FactoredMatrix
from qkov.model import AttnOnlyTransformer

SOURCE_BLOCK = 1024


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
        every = torch.arange(model.cfg.d_vocab, device=model.device)
        tokens = every if allowed is None else allowed.to(model.device).nonzero().squeeze(1)
        if tokens.numel() == 0:
            raise QkovError("no tokens left to search for skip-trigrams")
        qk = full_qk_circuit(model)[layer, head].to(torch.float64)
        ov = full_ov_circuit(model)[layer, head].to(torch.float64)
        qk = FactoredMatrix(qk.A[tokens], qk.B[:, tokens])
        ov = FactoredMatrix(ov.A[tokens], ov.B[:, tokens])
        return HeadCircuits(_centred(qk), _centred(ov), tokens)


@torch.no_grad()
def strongest_skip_trigrams(circuits: HeadCircuits, k: int = 50) -> list[SkipTrigram]:
    """The ``k`` strongest skip-trigrams of one head, strongest first (exact; see the module
    docstring)."""
    n = len(circuits.tokens)
    per_source = min(k, n)
    qk_values, dests = circuits.qk.T.topk_per_row(per_source)  # [source, per_source]
    ov_values, outs = circuits.ov.topk_per_row(per_source)
    best_values = torch.empty(0, dtype=torch.float64, device=qk_values.device)
    best_index = torch.empty(0, dtype=torch.long, device=qk_values.device)
    for start in range(0, n, SOURCE_BLOCK):
        q, o = qk_values[start : start + SOURCE_BLOCK], ov_values[start : start + SOURCE_BLOCK]
        product = q[:, :, None] * o[:, None, :]  # [sources, dest rank, out rank]
        product = product.masked_fill((q[:, :, None] <= 0) | (o[:, None, :] <= 0), -torch.inf)
        values, index = product.flatten().topk(min(k, product.numel()))
        best_values = torch.cat([best_values, values])
        best_index = torch.cat([best_index, index + start * per_source * per_source])
        keep = best_values.topk(min(k, best_values.numel())).indices
        best_values, best_index = best_values[keep], best_index[keep]
    trigrams = []
    for value, index in zip(best_values.tolist(), best_index.tolist(), strict=True):
        if value == -torch.inf:
            break
        source, rest = divmod(index, per_source * per_source)
        d_rank, o_rank = divmod(rest, per_source)
        trigrams.append(
            SkipTrigram(
                source=int(circuits.tokens[source]),
                destination=int(circuits.tokens[dests[source, d_rank]]),
                out=int(circuits.tokens[outs[source, o_rank]]),
                qk=float(qk_values[source, d_rank]),
                ov=float(ov_values[source, o_rank]),
                strength=value,
            )
        )
    return trigrams


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
