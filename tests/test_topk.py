"""The global top-k search (qkov.topk), pruned and streamed, against the dense float64 product
sorted stably: the same entries in the same order (equal values in row-major order), on random,
trained-like, flat, rank-deficient, tied and zero products; that pruning skips most of a decaying
spectrum's entries and that a flat one is streamed; and the per-row search against each row of the
dense product in ``torch.topk``'s order."""

from __future__ import annotations

from contextlib import contextmanager
from unittest.mock import patch

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qkov import FactoredMatrix, topk
from qkov.circuits.skip_trigrams import head_circuits, strongest_skip_trigrams
from qkov.config import Config
from qkov.model import AttnOnlyTransformer

PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
KINDS = [
    "gaussian",
    "trained",
    "flat-norms",
    "rank-deficient",
    "integer",
    "duplicates",
    "near-ties",
    "cancelling",
    "zero",
]


def factors(kind: str, m: int, n: int, r: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Factors of one kind. "trained": singular values ``i^-1.5`` and log-normal row and column
    norms; "integer": small integers, whose products tie exactly; "duplicates": repeated rows
    and columns (exact ties in float64); "near-ties": rows a relative 3e-8 apart, about what
    float32 resolves; "cancelling": near-ties plus a +1000 and a -1000 term in every entry, whose
    float32 sums lose the small terms' low bits, so that the float32 screen alone misorders them."""
    gen = np.random.default_rng(seed)
    A, B = gen.standard_normal((m, r)), gen.standard_normal((r, n))
    if kind == "trained":
        s = np.arange(1, r + 1) ** -0.75  # on each side: the product's ~ i^-1.5
        A = np.exp(0.5 * gen.standard_normal((m, 1))) * A * s
        B = s[:, None] * B * np.exp(0.5 * gen.standard_normal((1, n)))
    elif kind == "flat-norms":  # every row and column of the same norm: nothing for norms to prune
        A /= np.linalg.norm(A, axis=1, keepdims=True)
        B /= np.linalg.norm(B, axis=0, keepdims=True)
    elif kind == "rank-deficient" and r > 1:
        A[:, 1:] = A[:, :1] * gen.standard_normal(r - 1)
    elif kind == "integer":
        A, B = gen.integers(-2, 3, (m, r)).astype(float), gen.integers(-2, 3, (r, n)).astype(float)
    elif kind == "duplicates":
        A, B = A[gen.integers(0, max(1, m // 3), m)], B[:, gen.integers(0, max(1, n // 3), n)]
    elif kind == "near-ties":
        A = A[:1] + 3e-8 * gen.standard_normal((m, r))
    elif kind == "cancelling" and r > 2:
        A = A[:1] + 1e-6 * gen.standard_normal((m, r))
        A[:, :2], B[:2] = 1000.0, np.array([[1.0], [-1.0]])
    elif kind == "zero":
        B[:] = 0.0
    return A, B


@st.composite
def products(draw):
    kind = draw(st.sampled_from(KINDS))
    m, n, r = draw(st.integers(1, 300)), draw(st.integers(1, 300)), draw(st.integers(1, 12))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    A, B = factors(kind, m, n, r, draw(st.integers(0, 2**31 - 1)))
    return torch.tensor(A, dtype=dtype), torch.tensor(B, dtype=dtype)


@contextmanager
def small_leaves(leaf: int, path: str):
    """Leaves of ``leaf`` columns, and the pruned search (whatever its bounds promise) or the streamed
    one: both paths at test sizes."""
    limit = torch.inf if path == "pruned" else -torch.inf
    with patch.object(topk, "LEAF", leaf), patch.object(topk, "LIVE_LIMIT", limit):
        yield


def stable_descending(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return values.sort(dim=-1, descending=True, stable=True)


PATHS = st.sampled_from(["pruned", "streamed"])
SCREENS = ["float32", "bfloat16"]


@contextmanager
def screening(screen: str):
    """The CPU's screen in ``screen``, whatever this machine's probe (``topk._bf16_pays``) chose."""
    with patch.object(topk, "_bf16_pays", lambda threads: screen == "bfloat16"):
        yield


def dense_product(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """``A @ B`` in float64, each entry one sum of a contiguous float64 product, as ``qkov.topk``
    decides its candidates: equal rows give equal entries, which a float64 matmul does not promise
    (its rows round with their place in its blocks: two equal rows of a "duplicates" product, 7 and
    96 of 98, once came out a last bit apart, and the stable order of the ties was the matmul's)."""
    return (A.double()[:, None, :] * B.double().mT[None, :, :]).sum(-1)


@PROPERTY
@given(products(), st.integers(1, 60), st.booleans(), st.integers(1, 40), PATHS, st.sampled_from(SCREENS))
def test_topk_is_the_dense_product_sorted(product, k, largest, leaf, path, screen):
    A, B = product
    k = min(k, A.shape[0] * B.shape[1])
    dense = dense_product(A, B)
    with small_leaves(leaf, path), screening(screen):
        found = FactoredMatrix(A, B).topk(k, largest=largest, memory_bytes=leaf * B.shape[1] * 8)
    values, index = stable_descending(dense.flatten() if largest else -dense.flatten())
    assert torch.equal(found.rows * B.shape[1] + found.cols, index[:k])
    want = values[:k] if largest else -values[:k]
    torch.testing.assert_close(found.values, want.to(A.dtype), rtol=1e-12, atol=1e-12 * dense.abs().max())


@PROPERTY
@given(products(), st.integers(1, 40), st.booleans(), st.integers(1, 40))
def test_topk_per_row_is_each_row_of_the_product_in_topk_order(product, k, largest, rows):
    """Streamed in blocks of ``rows`` rows: each block's product in this dtype, ``torch.topk`` of its
    rows, equal values in ``torch.topk``'s order (the order the skip-trigram tables were always read
    in); the values are the dense float64 product's, up to this dtype's rounding."""
    A, B = product
    k = min(k, B.shape[1])
    budget = rows * B.shape[1] * A.element_size()
    values, cols = FactoredMatrix(A, B).topk_per_row(k, largest=largest, memory_bytes=budget)
    blocks = [
        (A[start : start + rows] @ B).topk(k, dim=-1, largest=largest) for start in range(0, len(A), rows)
    ]
    assert torch.equal(cols, torch.cat([block.indices for block in blocks]))
    assert torch.equal(values, torch.cat([block.values for block in blocks]))
    dense = (A.double() @ B.double()).topk(k, dim=-1, largest=largest).values
    scale = float(A.double().norm(dim=1).max() * B.double().norm(dim=0).max())
    atol = 8 * A.shape[1] * torch.finfo(A.dtype).eps * scale
    torch.testing.assert_close(values.double(), dense, rtol=0, atol=atol)


def screened_entries(search, *args) -> tuple[object, int]:
    """The result of ``search(*args)`` and how many product entries it screened."""
    count = 0
    screen = topk._screen

    def counted(search_, rows, cols, *offset):
        nonlocal count
        count += (rows.stop - rows.start) * len(cols)
        return screen(search_, rows, cols, *offset)

    with patch.object(topk, "_screen", counted):
        return search(*args), count


@pytest.mark.parametrize("kind", ["trained", "gaussian", "flat-norms"])
def test_a_decaying_spectrum_is_mostly_pruned_and_a_flat_one_streamed(kind):
    A, B = (torch.tensor(x, dtype=torch.float32) for x in factors(kind, 2500, 2000, 64, 0))
    with patch.object(topk, "_streamed", wraps=topk._streamed) as streamed:
        (values, index), count = screened_entries(topk.largest_entries, A, B, 100)
    dense = A.double() @ B.double()
    assert torch.equal(index, stable_descending(dense.flatten())[1][:100])
    torch.testing.assert_close(values, stable_descending(dense.flatten())[0][:100], rtol=1e-13, atol=0)
    if kind == "trained":
        assert count < 0.15 * dense.numel() and not streamed.called  # measured: 5%, 0.2% at 50257^2
    else:  # the bounds promise nothing: no leaf is screened, the product streamed once
        assert count == 0 and streamed.call_count == 1


def test_topk_over_a_batch_and_smallest_entries():
    gen = torch.Generator().manual_seed(0)
    A, B = torch.randn(2, 3, 50, 4, generator=gen), torch.randn(3, 4, 40, generator=gen)
    fm = FactoredMatrix(A, B)
    dense = (A.double() @ B.double()).reshape(2, 3, -1)
    smallest = fm.topk(7, largest=False)
    want = dense.topk(7, dim=-1, largest=False)
    assert torch.equal(smallest.rows * 40 + smallest.cols, want.indices)
    torch.testing.assert_close(smallest.values, want.values.float())


def test_skip_trigram_tables_read_in_blocks_are_those_of_the_dense_circuits():
    """The strongest skip-trigrams read through per-row searches of 16 rows at a time equal those read
    through the dense circuits' rows, ``torch.topk`` of each."""
    torch.manual_seed(0)
    model = AttnOnlyTransformer(Config(n_layers=1, n_heads=2, d_model=32, d_head=8, d_vocab=400, n_ctx=16))
    circuits = head_circuits(model, 0, 1)
    blocked = FactoredMatrix.topk_per_row

    def in_blocks(fm, k, largest=True, memory_bytes=0):
        return blocked(fm, k, largest, memory_bytes=16 * fm.n * fm.A.element_size())

    def dense_per_row(fm, k, largest=True, memory_bytes=0):
        found = fm.AB.topk(k, dim=-1, largest=largest)
        return found.values, found.indices

    with patch.object(FactoredMatrix, "topk_per_row", in_blocks):
        streamed = strongest_skip_trigrams(circuits, 30)
    with patch.object(FactoredMatrix, "topk_per_row", dense_per_row):
        dense = strongest_skip_trigrams(circuits, 30)
    assert [(t.source, t.destination, t.out) for t in streamed] == [
        (t.source, t.destination, t.out) for t in dense
    ]
    assert [t.strength for t in streamed] == [t.strength for t in dense]


def near_ties(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Factors whose every row holds 400 near-equal entries, 1e-6 apart under a cancelling +-1000."""
    A, B = (torch.tensor(x) for x in factors("cancelling", 400, 2, 12, seed))
    return B.mT.contiguous(), A.mT.contiguous()


@pytest.mark.parametrize("screen", SCREENS)
@pytest.mark.parametrize("path", ["pruned", "streamed"])
@pytest.mark.parametrize("seed", range(5))
def test_near_ties_that_the_screen_misorders_are_decided_in_float64(seed, path, screen):
    """Near-ties (:func:`near_ties`): float32 screening alone misorders them (12 rows in 20 when
    its error margin is dropped); the answer is the dense float64 order, whichever the screen."""
    rows, cols = near_ties(seed)
    dense = rows @ cols
    with small_leaves(topk.LEAF, path), screening(screen):
        values, index = topk.largest_entries(rows, cols, 20, block_rows=1)
    want, order = stable_descending(dense.flatten())
    assert torch.equal(index, order[:20])
    scale = float(rows.norm(dim=1).max() * cols.norm(dim=0).max())
    torch.testing.assert_close(values, want[:20], rtol=0, atol=1e-14 * scale)


def crossing(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Factors whose entries ``-d_i`` and ``-d_i / 2`` (``d_i`` in [0, 1)) are the difference of
    two terms ``L_i`` and ``L_i + d_i`` in [16, 32), where bfloat16's spacing is 1/8: whether
    ``L_i + d_i`` rounds to another value than ``L_i`` is nearly independent of ``d_i``, so the
    bfloat16 screen orders the entries nearly at random within 1/8 of each other."""
    gen = np.random.default_rng(seed)
    L, d = 16 + 16 * gen.random(400), gen.random(400)
    A = torch.tensor(np.stack([L, L + d], 1))
    return A, torch.tensor([[1.0, 0.5], [-1.0, -0.5]], dtype=torch.float64)


@pytest.mark.parametrize("path", ["pruned", "streamed"])
@pytest.mark.parametrize("seed", range(5))
def test_entries_the_bfloat16_screen_misorders_are_decided_in_float64(seed, path):
    A, B = crossing(seed)
    with small_leaves(topk.LEAF, path), screening("bfloat16"):
        values, index = topk.largest_entries(A, B, 20, block_rows=1)
    want, order = stable_descending((A @ B).flatten())
    assert torch.equal(index, order[:20]) and torch.equal(values, want[:20])


def test_a_bfloat16_screen_with_float32s_margin_misorders_them():
    """The rule can say no: the entries of :func:`crossing` screened in bfloat16 but decided
    within float32's error margin are not the dense top 20 (measured: 4 seeds in 5)."""
    float32_gamma = topk._gamma(2 + 3, topk.UNIT_ROUNDOFF)
    wrong = 0
    for seed in range(5):
        A, B = crossing(seed)
        bfloat16 = patch.object(topk, "_screening", lambda A: (topk.FAST_SCREEN, float32_gamma))
        with small_leaves(topk.LEAF, "streamed"), bfloat16:
            _, index = topk.largest_entries(A, B, 20, block_rows=1)
        wrong += not torch.equal(index, stable_descending((A @ B).flatten())[1][:20])
    assert wrong >= 3


@PROPERTY
@given(products())
def test_the_bfloat16_screen_is_within_its_error_bound(product):
    """Every entry screened in bfloat16 within ``gamma ||a_i|| ||b_j||`` of the dense float64 one
    (measured: at most 0.89 of it, at rank 1 and 2, on these kinds)."""
    A, B = product
    with screening("bfloat16"):
        screen, gamma = topk._screening(A)
    screened = (A.to(screen) @ B.to(screen)).double()
    dense = A.double() @ B.double()
    scale = A.double().norm(dim=1)[:, None] * B.double().norm(dim=0)
    assert screen == torch.bfloat16 and ((screened - dense).abs() <= gamma * scale).all()


@pytest.mark.parametrize(
    "bfloat16_ms, pays",
    [
        ([20.0, 0.4, 0.4, 0.4, 0.4, 0.4, 0.4], True),  # the first builds the kernel (measured 2.4-20 ms)
        ([1.5, 0.8, 0.8, 0.8, 0.8, 0.8, 0.8], False),  # 1.1x float32's: not worth it
        ([120.0, 95.0], False),  # no bfloat16 instructions: stops after the second product
    ],
)
def test_the_probe_times_bfloat16_after_its_kernel_is_built(bfloat16_ms, pays):
    """``_bf16_pays`` on a fake clock: float32's tile products take 0.9 ms (the first 2.4), the
    bfloat16 ones as given; the decision, and how many bfloat16 products it took."""
    clock, calls = [0.0], []
    float32_ms = iter([2.4] + [0.9] * (topk.PROBE_REPEATS + 1))
    bfloat16 = iter(bfloat16_ms)

    def fake_matmul(a, b, out):
        calls.append(a.dtype)
        clock[0] += (next(float32_ms) if a.dtype == torch.float32 else next(bfloat16)) / 1e3

    fake_clock = patch.object(topk, "perf_counter", lambda: clock[0])
    with patch.object(topk.torch, "matmul", fake_matmul), fake_clock:
        assert topk._bf16_pays.__wrapped__(2) is pays
    assert calls.count(torch.bfloat16) == (2 if bfloat16_ms[0] > 100 else topk.PROBE_REPEATS + 2)


def test_the_screen_is_bfloat16_only_on_a_cpu_where_it_pays():
    A = torch.zeros(3, 64)
    for pays, want in ((True, torch.bfloat16), (False, torch.float32)):
        with patch.object(topk, "_bf16_pays", lambda threads, pays=pays: pays):
            assert topk._screening(A)[0] == want
    assert isinstance(topk._bf16_pays(torch.get_num_threads()), bool)
