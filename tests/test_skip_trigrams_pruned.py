"""The pruned skip-trigram search (sources bounded by their circuits' row maxima) against every
source searched: the same table on random, trained-like, flat, tied and planted circuits, with
the leaves' bounds alone and with the float32-screened maxima; the row-maximum bounds against the
dense float64 product; and that a decaying spectrum leaves most sources unsearched."""

from __future__ import annotations

from unittest.mock import patch

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from qkov import FactoredMatrix, topk
from qkov.circuits import skip_trigrams
from qkov.circuits.skip_trigrams import HeadCircuits, strongest_skip_trigrams
from test_topk import PROPERTY, SCREENS, factors, products, screening


@given(products(), st.sampled_from(SCREENS))
@PROPERTY
def test_row_max_bounds_hold_and_the_screened_ones_are_within_their_error(product, screen):
    A, B = product
    dense = (A.double() @ B.double()).amax(1)
    leaf_bound = topk.row_max_bounds(A, B)
    with screening(screen):
        screened = topk.screened_row_max_bounds(A, B, block_rows=7, block_cols=5)
        _, gamma = topk._screening(A)
    assert (leaf_bound >= dense).all() and (screened >= dense).all()
    error = gamma * A.double().norm(dim=1) * B.double().norm(dim=0).max()
    assert (screened <= dense + 3 * error).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
def test_the_row_maxima_read_off_the_bits_are_amax(dtype):
    """Rows of mixed signs, all negative, all positive, signed zeros and infinities: the largest
    and smallest bits as signed integers give each row's ``amax``."""
    gen = torch.Generator().manual_seed(0)
    scales = torch.logspace(-30, 30, 50, dtype=torch.float64)
    rows = torch.randn(6, 50, generator=gen, dtype=torch.float64) * scales
    rows[1] = -rows[1].abs()
    rows[2] = rows[2].abs()
    rows[3, :25], rows[3, 25:] = -0.0, -1.0
    rows[4, 7], rows[5] = torch.inf, -torch.inf
    rows = rows.to(dtype)
    largest = topk._row_max(rows)
    assert torch.equal(largest, rows.amax(1))
    assert torch.equal(topk._row_max(rows[[0, 2, 4]]), rows[[0, 2, 4]].amax(1))  # each with a non-negative
    assert str(largest[3].item()) == "-0.0" and largest[4] == torch.inf and largest[5] == -torch.inf


def circuits(kind: str, n: int, r: int, seed: int) -> HeadCircuits:
    """A head's QK and OV circuits over ``n`` tokens from factors of one kind (tests/test_topk.py)."""
    qk, ov = (FactoredMatrix(*map(torch.tensor, factors(kind, n, n, r, seed + i))) for i in range(2))
    return HeadCircuits(qk, ov, torch.arange(n))


def table(found: list) -> list[tuple[int, int, int, float]]:
    """The triples and their strengths to 1e-13 (a row gathered alone and a row of a block may
    round differently in the last bits of a float64 matmul)."""
    return [(t.source, t.destination, t.out, pytest.approx(t.strength, rel=1e-13, abs=1e-300)) for t in found]


def searched(screened: float, k: int, head: HeadCircuits) -> tuple[list, int]:
    """The pruned search's table (``screened``: SCREENED_FRACTION) and how many sources it searched."""
    seen = []
    candidates = skip_trigrams._source_candidates

    def counting(circuits, sources, per_source):
        seen.append(len(sources))
        return candidates(circuits, sources, per_source)

    with (
        patch.object(skip_trigrams, "EXHAUSTIVE_TOKENS", 0),
        patch.object(skip_trigrams, "SCREENED_FRACTION", screened),
        patch.object(skip_trigrams, "PRUNE_BLOCK", 16),
        patch.object(skip_trigrams, "_source_candidates", counting),
    ):
        return strongest_skip_trigrams(head, k), sum(seen)


@pytest.mark.parametrize(
    "screened, screen",
    [(2.0, "float32"), (-1.0, "float32"), (-1.0, "bfloat16")],
    ids=["leaf-bounds", "screened-maxima", "bfloat16-screened-maxima"],
)
@pytest.mark.parametrize("kind", ["gaussian", "trained", "flat-norms", "rank-deficient", "zero"])
@pytest.mark.parametrize("seed", range(3))
def test_the_pruned_table_is_the_exhaustive_one(kind, seed, screened, screen):
    """Continuous circuits have no equal strengths: the same triples, strengths, and order."""
    head = circuits(kind, 300, 6, seed)
    for k in (1, 20, 50):
        with screening(screen):
            found, _ = searched(screened, k, head)
        assert table(found) == table(skip_trigrams._exhaustive(head, k))


@pytest.mark.parametrize("seed", range(5))
def test_with_ties_the_strengths_are_the_exhaustive_ones(seed):
    """Integer circuits tie exactly: the same strengths in the same order, and every triple kept is
    one of that strength (which of equal ones is kept at the table's end is torch.topk's choice)."""
    head = circuits("integer", 200, 4, seed)
    found, _ = searched(2.0, 50, head)
    want = skip_trigrams._exhaustive(head, 50)
    assert [t.strength for t in found] == [t.strength for t in want]  # small integers: exact
    for t in found:
        qk, ov = head.strength(t.source, t.destination, t.out)
        assert (qk, ov, qk * ov) == (t.qk, t.ov, t.strength) and qk > 0 and ov > 0


def test_a_decaying_spectrum_leaves_most_sources_unsearched_and_a_planted_triple_is_first():
    """Trained-like circuits over 2000 tokens: the table from under a tenth of the sources; a
    source planted far above the rest (1234, attended from 7) comes first."""
    head = circuits("trained", 2000, 16, 0)
    found, count = searched(0.1, 50, head)
    assert table(found) == table(skip_trigrams._exhaustive(head, 50))
    assert count < 200
    qk_A, ov_A = head.qk.A.clone(), head.ov.A.clone()
    qk_A[7] += 50 * head.qk.B[:, 1234] / head.qk.B[:, 1234].norm() ** 2  # qk(7, 1234) ~ 50 more
    ov_A[1234] += 50 * head.ov.B[:, 99] / head.ov.B[:, 99].norm() ** 2  # ov(1234, 99) ~ 50 more
    planted = HeadCircuits(FactoredMatrix(qk_A, head.qk.B), FactoredMatrix(ov_A, head.ov.B), head.tokens)
    found, _ = searched(0.1, 50, planted)
    assert table(found) == table(skip_trigrams._exhaustive(planted, 50))
    assert (found[0].source, found[0].destination) == (1234, 7)  # its outputs all rose with 99's
