"""The largest entries of a low-rank product ``A @ B``, exactly, without computing most of them
(the full circuits of section "Summarizing OV/QK Matrices": ``d_vocab x d_vocab``, rank ``d_head``).

Bound, then compute what the bound cannot rule out (branch and bound):

- *basis*: from pseudo-roots of the ``r x r`` Gram matrices ``A^T A`` and ``B B^T`` (float64) and
  the SVD of their small core, ``P = A M`` and ``Q = B^T N`` are the product's singular
  coordinates (``p_i = U_i S^(1/2)``, ``q_j = V_j S^(1/2)``), so entry ``(i, j)`` is ``p_i . q_j``
  up to a slack that is *computed*, not assumed (see :func:`_basis`). The first :data:`LEAD`
  coordinates are the *lead*, the rest the *tail*; ``|tail_i . tail_j| <= ||tail_i|| ||tail_j||``
  (Cauchy-Schwarz), small where the singular values decay, as they do in trained heads.
- *leaves*: rows and columns are cut into leaves of similar points (a k-d tree on the lead and
  the tail norm, median splits along the widest coordinate). A column leaf ``J`` keeps, per lead
  coordinate, its lowest and highest value and its largest tail norm, which bound row ``i``'s
  entries in ``J``: ``max_{j in J} (AB)_ij <= sum_t max(p_it lo_Jt, p_it hi_Jt) + ||tail_i||
  max_J ||tail_j|| + slack`` (one small matmul for a whole leaf of rows).
- *search*: row leaves in order of their best bound; a leaf's rows are multiplied (screened) only
  with the column leaves whose bound reaches the current ``k``-th best value ``tau``, and the
  search stops when no bound does.
- *fallback*: a flat spectrum, or flat norms, prune little, and screening leaf by leaf (gathered
  columns, bounds, per-leaf passes) costs more per entry than streaming the product. So before any
  of it, a first ``tau`` (the ``k``-th best entry between the rows and columns of the largest
  norms of the factors: a lower bound on the answer's) is held against bounds, and the product is
  streamed whole, in cache-sized tiles screened and decided as below, when the search would
  screen more than :data:`LIVE_LIMIT` (20%) of the entries: as sampled rows' bounds on entries say
  (no leaves needed, nor the whole product's basis: that of :data:`DECISION_ROWS` evenly spaced
  rows and columns, so that a flat product is streamed after a few milliseconds), then as the
  sampled rows' bounds on the column leaves say (before the row
  leaves are built), then as every row leaf's bounds say. Measured (``benchmarks/topk.py
  --sweep``, 20000 x 20000 at rank 64, 1 thread), the pruned search breaks even with streaming
  when it screens about 20% of the entries: 1.3x faster at 6-10%, 1.9x at 0.5%, 0.6-0.9x at
  30-100%; a trained-like spectrum at 50257 x 50257 screens 0.2%, a flat one 100%.

Precision, and the error bounds that make it exact:

- the slack bounds ``|(AB)_ij - p_i . q_j|`` for whatever ``M``, ``N`` rounding produced: the
  directions a pseudo-root drops (``||a_i D|| ||b_j||`` with ``D = M N^T - I`` computed) and the
  float64 rounding of ``P``, ``Q`` and of the bounds (``gamma_n`` terms, :func:`_basis`), so a
  pruned entry is provably below ``tau``; an ill-conditioned factor only loosens the bounds.
- screening in float32: ``|fl32(a_i . b_j) - a_i . b_j| <= gamma_{r+3} ||a_i|| ||b_j||`` with
  ``gamma_n = n u / (1 - n u)``, ``u = 2^-24`` (the dot product's rounding, for any summation order
  or FMA, plus rounding float64 factors to float32). Every entry whose float32 value lies within
  twice that of the ``k``-th best is *decided* in float64 from the factors; the ``k`` best of those
  are the answer, with their float64 values.
- or in bfloat16, on a CPU whose bfloat16 products run at least :data:`BF16_GAIN` times its float32
  ones (measured once per process and thread count, :func:`_bf16_pays`; on an AMD EPYC with
  AVX512-BF16, 2.3x for the products alone, 1.7-2.0x for whole screens): the factors rounded to
  bfloat16 (``u_b = 2^-8``, plus ``2^-24`` where a float64 factor is rounded through float32),
  their products exact in float32 (8-bit significands), summed in float32 (``gamma_r``,
  ``u = 2^-24``), each entry rounded to bfloat16 (``u_b``), so that
  ``|fl(a_i . b_j) - a_i . b_j| <= ((1 + u_b')^2 (1 + gamma_r) (1 + u_b) - 1) ||a_i|| ||b_j||``,
  about ``3 u_b`` (0.012 of the norms' product): about 2^16 times more entries are decided in
  float64 than under a float32 screen, a handful around the ``k``-th best. The answer is the same
  entries, in the same order, with the same float64 values, as the float32 screen's. Not on a GPU,
  where a bfloat16 product may sum in bfloat16 (``allow_bf16_reduced_precision_reduction``).
- both bounds assume no underflow (entries and factors of norms far above ``2^-126``).
- ties: equal float64 values are ordered by position (smaller row-major index first), as a stable
  sort of the dense product would order them.
"""

from __future__ import annotations

import math
from functools import cache
from time import perf_counter
from typing import NamedTuple

import torch
from jaxtyping import Float, Int
from torch import Tensor

LEAD = 8  # leading singular coordinates boxed per leaf; the rest bounded by Cauchy-Schwarz
LEAF = 128  # rows or columns per leaf: 128 x 50257 float32 entries (25 MiB) per screening block
SCREEN_TILE = 1024  # rows and columns of a row-maximum screening tile: 4 MiB of float32, in cache
ROOT_CUTOFF = 1e-10  # Gram eigenvalues below this fraction of the largest: a direction dropped
BOUND_ROWS = 4096  # rows whose bounds are computed at once (4096 x 393 leaves: 13 MiB)
DECIDE_CHUNK = 16384  # candidates decided at once: 2 x 8 MiB of gathered float64 rows at r = 64
DENSE_FRACTION = 0.5
LIVE_LIMIT = 0.2  # pruned only where it expects to screen at most this fraction (the break-even)
SAMPLE = 64  # rows and columns of the largest norms whose entries give a first k-th best
DECISION_ROWS = 4096  # evenly spaced rows and columns whose product the first estimate reads
SAMPLE_ROWS = 64  # rows whose bounds estimate what the search would screen (64 x 50257: 25 MiB)
SCREEN = torch.float32
UNIT_ROUNDOFF = 2.0**-24  # of SCREEN
FAST_SCREEN = torch.bfloat16
FAST_UNIT_ROUNDOFF = 2.0**-8  # of FAST_SCREEN (8 significant bits)
# FAST_SCREEN is used where its tile products run this many times SCREEN's: below it, the 2^16 times
# more float64 decisions and the looser row maxima would eat the gain.
BF16_GAIN = 1.25
PROBE_REPEATS = 5  # timed products per precision in _bf16_pays, the best kept (12-14 ms in all, measured)
NO_BF16_SLOWDOWN = 20  # a second bfloat16 product this many times float32's best: no instructions for it
DECIDE = torch.float64
BITS = {torch.bfloat16: torch.int16, torch.float32: torch.int32, torch.float64: torch.int64}  # same widths


class _Leaves(NamedTuple):
    """One side (rows of ``A B`` or its columns) in leaf order, with each leaf's box."""

    order: Int[Tensor, "N"]  # leaf-ordered position -> original row (column)
    leaf_of: Int[Tensor, "N"]  # leaf of each leaf-ordered position
    starts: list[int]  # first position of each leaf, then N
    lead: Float[Tensor, "N p"]
    slack: Float[Tensor, "N 3"]  # nonnegative terms whose products bound the rest (see _basis)
    norm: Float[Tensor, "N"]  # ||a_i|| (||b_j||): the screening error's scale
    lo: Float[Tensor, "L p"]
    hi: Float[Tensor, "L p"]
    slack_max: Float[Tensor, "L 3"]

    @property
    def box(self) -> Float[Tensor, "2p+3 L"]:
        """What a row's ``[max(p, 0), max(-p, 0), slack]`` is multiplied by for its bound."""
        return torch.cat([self.hi, -self.lo, self.slack_max], 1).mT


class _Basis(NamedTuple):
    """The factors in float64 and the product's singular coordinates with their slack (:func:`_basis`)."""

    a: Float[Tensor, "m r"]
    b: Float[Tensor, "r n"]
    P: Float[Tensor, "m k"]
    Q: Float[Tensor, "n k"]
    row_slack: Float[Tensor, "m 3"]
    col_slack: Float[Tensor, "n 3"]


class _Search(NamedTuple):
    """A product ready to search: both sides' leaves and the factors in leaf order."""

    rows: _Leaves
    cols: _Leaves
    a_screen: Float[Tensor, "m r"]
    b_screen: Float[Tensor, "r n"]
    a_decide: Float[Tensor, "m r"]
    b_decide: Float[Tensor, "n r"]  # B^T: a candidate's column is gathered as a contiguous row
    buffer: Float[Tensor, "leaf*n"]  # every screened block, reused: no fresh pages per block
    gamma: float  # gamma_{r+3} of the screening precision


def _split(points: Float[Tensor, "N d"], leaf: int) -> tuple[Tensor, list[int]]:
    """A k-d partition: the order of the points and the first position of each leaf (at most
    ``leaf`` points), every part split at the median of its widest coordinate, a level at a time
    (one sort per level: by part, then by the widest coordinate scaled into ``[0, 1/2]``)."""
    n = points.shape[0]
    order = torch.arange(n, device=points.device)
    cuts = torch.zeros(1, dtype=torch.long, device=points.device)
    while True:
        ends = torch.cat([cuts[1:], cuts.new_tensor([n])])
        split = ends - cuts > leaf
        if not bool(split.any()):
            return order, [*cuts.tolist(), n]
        inside = points[order]
        lo = torch.segment_reduce(inside, "min", lengths=ends - cuts, axis=0)
        hi = torch.segment_reduce(inside, "max", lengths=ends - cuts, axis=0)
        widest = (hi - lo).argmax(1, keepdim=True)
        part = torch.repeat_interleave(torch.arange(len(cuts), device=cuts.device), ends - cuts)
        low, width = lo.gather(1, widest)[part, 0], (hi - lo).gather(1, widest)[part, 0]
        within = (inside.gather(1, widest[part])[:, 0] - low) / width.clamp_min(torch.finfo(width.dtype).tiny)
        order = order[(part + within.clamp(0, 1) / 2).argsort(stable=True)]
        cuts = torch.cat([cuts, ((cuts + ends) // 2)[split]]).sort().values


def _per_part(values: Float[Tensor, "N d"], part: Int[Tensor, "N"], parts: int, how: str) -> Tensor:
    """``how`` ("amin", "amax") of ``values`` over each part, ``[parts, d]``."""
    into = values.new_zeros(parts, values.shape[1])
    return into.scatter_reduce(0, part[:, None].expand_as(values), values, how, include_self=False)


def _leaves(coords: Float[Tensor, "N k"], slack: Float[Tensor, "N 3"], norm: Tensor, leaf: int) -> _Leaves:
    """Cut one side into leaves of similar lead coordinates and tail norms (``slack[:, 0]``), and
    box each leaf."""
    lead = coords[:, :LEAD]
    order, starts = _split(torch.cat([lead, slack[:, :1]], 1), leaf)
    lead, slack = lead[order], slack[order]
    sizes = torch.tensor(starts, device=coords.device).diff()
    leaf_of = torch.repeat_interleave(torch.arange(len(sizes), device=coords.device), sizes)

    def reduce(values: Tensor, how: str) -> Tensor:
        into = values.new_zeros(len(sizes), values.shape[1])
        return into.scatter_reduce(0, leaf_of[:, None].expand_as(values), values, how, include_self=False)

    return _Leaves(
        order,
        leaf_of,
        starts,
        lead,
        slack,
        norm[order],
        reduce(lead, "amin"),
        reduce(lead, "amax"),
        reduce(slack, "amax"),
    )


def _pseudo_root(gram: Float[Tensor, "r r"]) -> tuple[Tensor, Tensor]:
    """``R [k, r]`` and ``R^+ [r, k]`` with ``R^T R`` the part of ``gram`` above ``ROOT_CUTOFF`` of its
    largest eigenvalue and ``R R^+ = I``."""
    eigenvalues, vectors = torch.linalg.eigh(gram)
    keep = eigenvalues > ROOT_CUTOFF * eigenvalues[-1].clamp_min(torch.finfo(gram.dtype).tiny)
    root = eigenvalues[keep].sqrt()
    return root[:, None] * vectors[:, keep].mT, vectors[:, keep] / root


def _basis(a: Float[Tensor, "m r"], b: Float[Tensor, "r n"]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``P = a M`` and ``Q = b^T N`` (the product's singular coordinates, ``M N^T`` the identity on the
    kept directions), and each side's slack: ``(AB)_ij <= p_i . q_j + sum_s slack_is slack_js``.

    The slack terms are the tail (``||p_i tail|| ||q_j tail||``), the directions a pseudo-root drops
    (``||a_i D|| ||b_j||`` with ``D = M N^T - I``, computed) and the rounding of ``P``, ``Q`` and of the
    bounds themselves (``gamma (||a_i|| ||M|| + ||p_i||) (||b_j|| ||N|| + (1 + sqrt(LEAD)) ||q_j||)``)."""
    R_a, R_a_plus = _pseudo_root(a.mT @ a)
    R_b, R_b_plus = _pseudo_root(b @ b.mT)
    W, S, Zh = torch.linalg.svd(R_a @ R_b.mT, full_matrices=False)
    M, N = (R_a_plus @ W) * S.sqrt(), (R_b_plus @ Zh.mT) * S.sqrt()
    P, Q = a @ M, b.mT @ N
    D = M @ N.mT - torch.eye(a.shape[1], dtype=a.dtype, device=a.device)
    a_norm, b_norm = a.norm(dim=1), b.norm(dim=0)
    gamma = 4 * _gamma(2 * a.shape[1] + LEAD + 8, torch.finfo(a.dtype).eps / 2)
    row_slack = [P[:, LEAD:].norm(dim=1), (a @ D).norm(dim=1) + gamma * a_norm * D.norm()]
    col_slack = [Q[:, LEAD:].norm(dim=1), b_norm]
    row_slack.append(gamma * (a_norm * M.norm() + P.norm(dim=1)))
    col_slack.append(b_norm * N.norm() + (1 + LEAD**0.5) * Q.norm(dim=1))
    return P, Q, torch.stack(row_slack, 1), torch.stack(col_slack, 1)


def _gamma(n: int, unit: float) -> float:
    """``gamma_n = n u / (1 - n u)``: the relative rounding of an ``n``-term dot product."""
    return n * unit / (1 - n * unit)


def _column_leaves(basis: _Basis) -> _Leaves:
    return _leaves(basis.Q, basis.col_slack, basis.b.norm(dim=0), LEAF)


def _prepare(A: Float[Tensor, "m r"], basis: _Basis, cols: _Leaves, row_leaf: int) -> _Search:
    """The row leaves and the factors in leaf order (see the module docstring)."""
    a, b = basis.a, basis.b
    rows = _leaves(basis.P, basis.row_slack, a.norm(dim=1), row_leaf)
    a, b = a[rows.order], b.mT[cols.order]
    screen, gamma = _screening(A)
    buffer = torch.empty(row_leaf * b.shape[0], dtype=screen, device=b.device)
    return _Search(rows, cols, a.to(screen), b.mT.to(screen).contiguous(), a, b, buffer, gamma)


def _screening(A: Float[Tensor, "m r"]) -> tuple[torch.dtype, float]:
    """The screening precision on ``A``'s device and its error's factor (see the module docstring):
    bfloat16 on a CPU where it pays (:func:`_bf16_pays`), else float32 where matmuls round as IEEE
    float32, else float64; ``gamma_{r+3}`` of the last two."""
    r = A.shape[1]
    if A.device.type == "cpu" and _bf16_pays(torch.get_num_threads()):
        rounded = FAST_UNIT_ROUNDOFF + 2 * UNIT_ROUNDOFF  # a float64 factor may round through float32
        return FAST_SCREEN, (1 + rounded) ** 2 * (1 + _gamma(r, UNIT_ROUNDOFF)) * (1 + FAST_UNIT_ROUNDOFF) - 1
    screen = SCREEN if _screen_is_ieee(A.device) else DECIDE
    unit = UNIT_ROUNDOFF if screen == SCREEN else torch.finfo(DECIDE).eps / 2
    return screen, _gamma(r + 3, unit)


@cache
def _bf16_pays(threads: int) -> bool:
    """Whether a screening tile (``SCREEN_TILE`` rows and columns, rank 64, into a reused buffer as
    the screens write it) multiplies at least :data:`BF16_GAIN` times faster in bfloat16 than in
    float32 on this CPU with ``threads`` threads: the best of :data:`PROBE_REPEATS` products each,
    after two. bfloat16's first product builds its kernel: 2.4-20 ms against 0.4 after, on an AMD
    EPYC, so it is never timed. Measured, not read off the CPU's flags: without bfloat16
    instructions PyTorch's bfloat16 products run about 100 times below float32's, and the probe
    stops at the second one."""
    best = {}
    for dtype in (SCREEN, FAST_SCREEN):
        a, b = torch.randn(SCREEN_TILE, 64, dtype=dtype), torch.randn(64, SCREEN_TILE, dtype=dtype)
        out = torch.empty(SCREEN_TILE, SCREEN_TILE, dtype=dtype)
        times = []
        for _ in range(PROBE_REPEATS + 2):
            started = perf_counter()
            torch.matmul(a, b, out=out)
            times.append(perf_counter() - started)
            if dtype == FAST_SCREEN and len(times) == 2 and times[1] > NO_BF16_SLOWDOWN * best[SCREEN]:
                return False
        best[dtype] = min(times[2:])
    return best[SCREEN] >= BF16_GAIN * best[FAST_SCREEN]


def _screen_is_ieee(device: torch.device) -> bool:
    """float32 matmuls round as IEEE float32 (not TF32 or bfloat16, which a GPU may be set to use)."""
    return device.type == "cpu" or torch.get_float32_matmul_precision() == "highest"


def _bounds(search: _Search, rows: slice) -> Float[Tensor, "b L"]:
    """An upper bound on each row's entries in each column leaf."""
    return _row_bounds(search.rows.lead[rows], search.rows.slack[rows], search.cols)


def _row_bounds(lead: Float[Tensor, "b p"], slack: Float[Tensor, "b 3"], cols: _Leaves) -> Tensor:
    """An upper bound on the entries of the rows of singular coordinates ``lead`` (and ``slack``) in
    each column leaf."""
    return torch.cat([lead.clamp_min(0), (-lead).clamp_min(0), slack], 1) @ cols.box


def _screened(reach: Float[Tensor, "b L"], cols: _Leaves) -> Float[Tensor, "b"]:
    """How many columns a row (leaf) screens when ``reach`` (0 or 1) marks the column leaves whose
    bound reaches ``tau``: all of them past ``DENSE_FRACTION`` (see :func:`_columns`)."""
    sizes = torch.tensor(cols.starts, dtype=reach.dtype, device=reach.device).diff()
    n = float(sizes.sum())
    screened = reach @ sizes
    return torch.where(screened > DENSE_FRACTION * n, n, screened)


def _columns(search: _Search, live: Tensor) -> Int[Tensor, "c"]:
    """Leaf-ordered positions of the columns in the ``live`` column leaves; every column when
    they hold more than ``DENSE_FRACTION`` of them (screening the rest too costs less than
    gathering the live ones)."""
    cols = live[search.cols.leaf_of].nonzero().squeeze(1)
    if len(cols) > DENSE_FRACTION * len(live[search.cols.leaf_of]):
        return torch.arange(len(search.cols.order), device=cols.device)
    return cols


def _decide(a: Float[Tensor, "m r"], b_t: Float[Tensor, "n r"], rows: Tensor, cols: Tensor) -> Tensor:
    """Exact (float64) entries ``a[rows] . b_t[cols]``, one dot product each (the same value whatever
    block an entry was screened in), ``DECIDE_CHUNK`` at a time; the gathered rows are widened to
    float64 (the same numbers as gathered from a float64 copy, without one)."""
    return torch.cat(
        [
            (a[rows[at : at + DECIDE_CHUNK]].to(DECIDE) * b_t[cols[at : at + DECIDE_CHUNK]].to(DECIDE)).sum(1)
            for at in range(0, len(rows), DECIDE_CHUNK)
        ]
        or [a.new_empty(0, dtype=DECIDE)]
    )


def _kth(values: Float[Tensor, "... c"], k: int) -> Float[Tensor, "..."]:
    return values.topk(k, dim=-1).values[..., -1]


def _ranked(values: Tensor, keys: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The first ``k`` by value (descending), equal values by key (ascending)."""
    by_key = keys.argsort(stable=True)
    by_value = values[by_key].argsort(descending=True, stable=True)[:k]
    return values[by_key][by_value], keys[by_key][by_value]


def _at_most(threshold: Float[Tensor, "..."], dtype: torch.dtype) -> Tensor:
    """``threshold`` (float64) in ``dtype``, rounded down, so that ``x >= result`` keeps every ``x``
    of ``dtype`` with ``x >= threshold``."""
    rounded = threshold.to(dtype)
    return torch.where(
        rounded.to(threshold.dtype) > threshold, rounded.nextafter(rounded.new_tensor(-torch.inf)), rounded
    )


def _screen(search: _Search, rows: slice, cols: Tensor, offset: int = 0) -> Float[Tensor, "b c"]:
    """``A[rows] B[:, cols]`` in the screening precision, into the buffer from ``offset`` on."""
    out = search.buffer[offset : offset + (rows.stop - rows.start) * len(cols)].view(-1, len(cols))
    b = search.b_screen if len(cols) == search.b_screen.shape[1] else search.b_screen[:, cols]
    return torch.matmul(search.a_screen[rows], b, out=out)


@torch.no_grad()
def largest_entries(
    A: Float[Tensor, "m r"], B: Float[Tensor, "r n"], k: int, row_leaf: int = LEAF, block_rows: int = LEAF
) -> tuple[Float[Tensor, "k"], Int[Tensor, "k"]]:
    """The ``k`` largest entries of ``A @ B`` (float64, descending; equal values by row-major
    index) and their row-major indices, exactly (see the module docstring).

    Pruned (``row_leaf`` rows screened at a time) only where the bounds promise to skip most of
    the product: against a first ``tau`` (:func:`_first_tau`), sampled rows' bounds on entries
    (:func:`_pointwise_live`), then on column leaves (:func:`_sampled_live`), then every row
    leaf's bounds (:func:`_leaf_bounds`), cheapest first, must each leave at most
    :data:`LIVE_LIMIT` of the entries to screen; otherwise the product is streamed, ``block_rows``
    rows at a time (:func:`_streamed`), at the cost of the exhaustive search."""
    A, B = A.detach(), B.detach()
    tau = _first_tau(A, B, k)
    if _pointwise_live(_sampled_basis(A, B), tau) > LIVE_LIMIT:
        return _streamed(A, B, k, block_rows)
    a, b = A.to(DECIDE), B.to(DECIDE)
    basis = _Basis(a, b, *_basis(a, b))
    cols = _column_leaves(basis)
    if _sampled_live(basis, cols, tau) > LIVE_LIMIT:
        return _streamed(A, B, k, block_rows)
    search = _prepare(A, basis, cols, row_leaf)
    leaf_bound, live = _leaf_bounds(search, tau)
    if live > LIVE_LIMIT:
        return _streamed(A, B, k, block_rows)
    return _pruned(search, leaf_bound, k)


def _first_tau(A: Float[Tensor, "m r"], B: Float[Tensor, "r n"], k: int) -> float:
    """A lower bound on the ``k``-th best entry: the ``k``-th best of the entries (float64) between
    the :data:`SAMPLE` rows and columns of the largest norms (``-inf`` if fewer)."""
    side = max(SAMPLE, math.isqrt(k - 1) + 1)
    rows = _norms(A, 1).topk(min(A.shape[0], side)).indices
    cols = _norms(B, 0).topk(min(B.shape[1], side)).indices
    if len(rows) * len(cols) < k:
        return -math.inf
    return float(_kth((A[rows].to(DECIDE) @ B[:, cols].to(DECIDE)).flatten(), k))


def _norms(X: Tensor, dim: int) -> Float[Tensor, "N"]:
    """Euclidean norms along ``dim``, accumulated in float64 (no float64 copy of ``X``)."""
    return torch.linalg.vector_norm(X, dim=dim, dtype=DECIDE)


def _sampled_basis(A: Float[Tensor, "m r"], B: Float[Tensor, "r n"]) -> _Basis:
    """The basis (:func:`_basis`) of the product of :data:`DECISION_ROWS` evenly spaced rows and
    columns: its bounds on its entries hold as the whole product's do (the slack is computed for
    the ``M``, ``N`` it has) and say as much about pruning, for a twelfth of the work at 50257."""
    rows = torch.arange(0, A.shape[0], max(1, A.shape[0] // DECISION_ROWS), device=A.device)
    cols = torch.arange(0, B.shape[1], max(1, B.shape[1] // DECISION_ROWS), device=B.device)
    a, b = A[rows].to(DECIDE), B[:, cols].to(DECIDE)
    return _Basis(a, b, *_basis(a, b))


def _sampled_rows(basis: _Basis) -> Int[Tensor, "s"]:
    """:data:`SAMPLE_ROWS` evenly spaced rows."""
    m = len(basis.P)
    return torch.arange(0, m, max(1, m // SAMPLE_ROWS), device=basis.P.device)


def _pointwise_live(basis: _Basis, tau: float) -> float:
    """The fraction of entries of the sampled rows whose lower bound on every leaf bound
    (``lead_i . lead_j + slack_i . slack_j``: the box and slack maxima of a leaf holding column
    ``j`` are at least column ``j``'s) reaches ``tau``: needs no leaves."""
    if tau == -math.inf:
        return 1.0
    rows = _sampled_rows(basis)
    left = torch.cat([basis.P[rows, :LEAD], basis.row_slack[rows]], 1)
    right = torch.cat([basis.Q[:, :LEAD], basis.col_slack], 1)
    return int((left @ right.mT >= tau).count_nonzero()) / (len(rows) * len(right))


def _sampled_live(basis: _Basis, cols: _Leaves, tau: float) -> float:
    """The fraction of entries that the sampled rows would screen against ``tau``, each on its own
    (a row leaf screens the union of its rows' live column leaves: more)."""
    rows = _sampled_rows(basis)
    reach = _row_bounds(basis.P[rows, :LEAD], basis.row_slack[rows], cols) >= tau
    return float(_screened(reach.to(DECIDE), cols).mean()) / len(cols.order)


def _leaf_bounds(search: _Search, tau: float) -> tuple[Float[Tensor, "L"], float]:
    """Each row leaf's bound on its entries, and the fraction of entries the search would screen
    against ``tau`` (the column leaves whose bound reaches it, per row leaf, or all columns past
    ``DENSE_FRACTION``), from the rows' bounds, ``BOUND_ROWS`` rows at a time."""
    rows, cols = search.rows, search.cols
    parts = len(rows.starts) - 1
    best = torch.empty(len(rows.order), dtype=DECIDE, device=rows.lead.device)
    reach = torch.zeros(parts, len(cols.starts) - 1, dtype=DECIDE, device=best.device)
    for start in range(0, len(best), BOUND_ROWS):
        bounds = _bounds(search, slice(start, start + BOUND_ROWS))
        best[start : start + BOUND_ROWS] = bounds.amax(1)
        leaf_of = rows.leaf_of[start : start + BOUND_ROWS, None].expand(-1, bounds.shape[1])
        reach.scatter_reduce_(0, leaf_of, (bounds >= tau).to(DECIDE), "amax")
    leaf_bound = _per_part(best[:, None], rows.leaf_of, parts, "amax")[:, 0]
    screened = _screened(reach, cols) * (leaf_bound >= tau)
    row_sizes = torch.tensor(rows.starts, dtype=DECIDE, device=best.device).diff()
    return leaf_bound, float(screened @ row_sizes) / (len(rows.order) * len(cols.order))


def _pruned(search: _Search, leaf_bound: Float[Tensor, "L"], k: int) -> tuple[Tensor, Tensor]:
    """Row leaves in order of their bound, each screened against the current ``k``-th best."""
    starts = search.rows.starts
    values = torch.empty(0, dtype=DECIDE, device=leaf_bound.device)
    index = torch.empty(0, dtype=torch.long, device=leaf_bound.device)
    for leaf in leaf_bound.argsort(descending=True).tolist():
        tau = float(values[-1]) if len(values) == k else -torch.inf
        if leaf_bound[leaf] < tau:
            break  # every remaining leaf's bound is lower still
        found_values, found_index = _leaf_candidates(search, slice(starts[leaf], starts[leaf + 1]), tau, k)
        values, index = _ranked(torch.cat([values, found_values]), torch.cat([index, found_index]), k)
    return values, index


def _candidates(
    screened: Float[Tensor, "b c"], best: Float[Tensor, "b"], tau: float, k: int, error: Tensor
) -> tuple[Tensor, Tensor]:
    """Positions ``(row, column)`` in ``screened`` of every entry that can beat ``tau`` (or, before
    ``k`` are held, be among the block's ``k`` best), ``error`` bounding the screening error;
    ``best`` holds each row's largest (only rows holding a candidate are compared)."""
    if tau > -torch.inf:
        threshold = tau - error
    elif screened.numel() >= k:  # each row's best first: cheaper than one top-k of the whole block
        each = screened.topk(min(k, screened.shape[1]), dim=1).values
        threshold = _kth(each.flatten(), k).to(DECIDE) - 2 * error
    else:
        threshold = error.new_tensor(-torch.inf)
    threshold = _at_most(threshold, screened.dtype)
    hot = (best >= threshold).nonzero()[:, 0]
    at_row, at_col = (screened[hot] >= threshold).nonzero().unbind(1)
    return hot[at_row], at_col


def _leaf_candidates(search: _Search, rows: slice, tau: float, k: int) -> tuple[Tensor, Tensor]:
    """Entries of one row leaf that can beat ``tau`` (see :func:`_candidates`), decided in float64,
    with their row-major indices."""
    live = _columns(search, (_bounds(search, rows) >= tau).any(0))
    if live.numel() == 0:
        return search.a_decide.new_empty(0), live
    screened = _screen(search, rows, live)
    error = search.gamma * search.rows.norm[rows].max() * search.cols.norm[live].max()
    at_row, at_col = _candidates(screened, _row_max(screened), tau, k, error)
    positions, cols = at_row + rows.start, live[at_col]
    exact = _decide(search.a_decide, search.b_decide, positions, cols)
    return exact, search.rows.order[positions] * len(search.cols.order) + search.cols.order[cols]


def _streamed(
    A: Float[Tensor, "m r"], B: Float[Tensor, "r n"], k: int, block_rows: int
) -> tuple[Tensor, Tensor]:
    """The exhaustive search, a tile of at most ``SCREEN_TILE`` x ``SCREEN_TILE`` entries (and no
    more than ``block_rows`` whole rows hold) at a time, screened into one reused buffer that stays
    in cache while it is read: a tile whose largest entry is below ``tau`` by more than its
    screening error is passed over after that one pass, the others' candidates
    (:func:`_candidates`) are decided in float64 (:func:`_decide`). ``tau`` is the ``k``-th best
    decided so far: the first tile's own ``k`` best set it high at once (higher than
    :func:`_first_tau`'s sample, so that few later tiles hold a candidate)."""
    m, n = A.shape[0], B.shape[1]
    screen, gamma = _screening(A)
    a_screen, b_decide = A.to(screen), B.mT.contiguous()
    cols = min(n, SCREEN_TILE)
    rows = max(1, min(SCREEN_TILE, block_rows * n // cols))
    parts = [B[:, at : at + cols].to(screen).contiguous() for at in range(0, n, cols)]
    col_norm = [float(x.max()) for x in _norms(B, 0).split(cols)]
    row_norm = [float(x.max()) for x in _norms(A, 1).split(rows)]
    buffer = torch.empty(min(rows, m) * cols, dtype=screen, device=A.device)
    values, index = A.new_empty(0, dtype=DECIDE), torch.empty(0, dtype=torch.long, device=A.device)
    tau = -math.inf
    for start, row_max in zip(range(0, m, rows), row_norm, strict=True):
        block = a_screen[start : start + rows]
        for first, part, col_max in zip(range(0, n, cols), parts, col_norm, strict=True):
            tile = torch.matmul(block, part, out=buffer[: len(block) * part.shape[1]].view(len(block), -1))
            best, error = _row_max(tile), gamma * row_max * col_max
            if tau > -math.inf and float(best.max()) < tau - error:
                continue  # no entry can beat tau (_candidates keeps x >= tau - error, nothing else)
            bound = torch.tensor(error, dtype=DECIDE, device=A.device)
            at_row, at_col = _candidates(tile, best, tau, k, bound)
            at_row, at_col = at_row + start, at_col + first
            exact = _decide(A, b_decide, at_row, at_col)
            values, index = _ranked(torch.cat([values, exact]), torch.cat([index, at_row * n + at_col]), k)
            tau = float(values[-1]) if len(values) == k else -math.inf
    return values, index


@torch.no_grad()
def row_max_bounds(A: Float[Tensor, "m r"], B: Float[Tensor, "r n"]) -> Float[Tensor, "m"]:
    """An upper bound on each row's largest entry of ``A @ B`` (float64), from the column leaves'
    boxes and the slack of the search's bounds (see the module docstring), without computing any
    entry: ``O(m (n / LEAF) LEAD)`` work. Tight where the spectrum decays; where it is flat the
    Cauchy-Schwarz tail makes it loose (:func:`screened_row_max_bounds` is tight there)."""
    a, b = A.detach().to(DECIDE), B.detach().to(DECIDE)
    basis = _Basis(a, b, *_basis(a, b))
    cols = _column_leaves(basis)
    return torch.cat(
        [
            _row_bounds(
                basis.P[at : at + BOUND_ROWS, :LEAD], basis.row_slack[at : at + BOUND_ROWS], cols
            ).amax(1)
            for at in range(0, len(a), BOUND_ROWS)
        ]
    )


@torch.no_grad()
def screened_row_max_bounds(
    A: Float[Tensor, "m r"],
    B: Float[Tensor, "r n"],
    block_rows: int = SCREEN_TILE,
    block_cols: int = SCREEN_TILE,
) -> Float[Tensor, "m"]:
    """An upper bound on each row's largest entry of ``A @ B`` (float64): the row maximum screened
    (:func:`_screening`: one streamed pass, a ``block_rows x block_cols`` tile at a time into one
    reused buffer that stays in cache while its maxima are read) plus its error bound
    ``gamma ||a_i|| max_j ||b_j||`` (see the module docstring), with ``gamma_{2r+8}`` of float64
    added for the float64 rounding of the norms (``r`` terms each), their products and the sum, so
    that the bound cannot round below the true maximum. (The bound used to be twice the screening
    error, which at the bfloat16 screen's ``gamma`` doubled its looseness for nothing.)"""
    screen, gamma = _screening(A)
    a, b = A.detach(), B.detach()
    a_screen = a.to(screen)
    columns = [b[:, at : at + block_cols].to(screen).contiguous() for at in range(0, b.shape[1], block_cols)]
    rounding = _gamma(2 * a.shape[1] + 8, torch.finfo(DECIDE).eps / 2)
    error = (gamma + rounding) * a.to(DECIDE).norm(dim=1) * b.to(DECIDE).norm(dim=0).max()
    buffer = torch.empty(min(block_rows, len(a)) * min(block_cols, b.shape[1]), dtype=screen, device=a.device)
    best = torch.full((len(a),), -math.inf, dtype=screen, device=a.device)
    for at in range(0, len(a), block_rows):
        rows, held = a_screen[at : at + block_rows], best[at : at + block_rows]
        for part in columns:
            tile = torch.matmul(rows, part, out=buffer[: len(rows) * part.shape[1]].view(len(rows), -1))
            torch.maximum(held, _row_max(tile), out=held)
    return best.to(DECIDE) + error


def _row_max(tile: Float[Tensor, "b c"]) -> Float[Tensor, "b"]:
    """Each row's largest entry (``tile.amax(1)``, ``c >= 1``), read off the entries' bits as signed
    integers (:data:`BITS`): an IEEE float's sign is the integer's, a non-negative float orders as
    its bits and a negative one in reverse (its magnitude's bits follow the sign bit), so a row's
    largest bits are its largest float unless every float is negative, when its smallest bits are.
    A bfloat16 ``amax`` ran at a sixth of the speed of this (18 against 2.5-3.6 ms per 128 tiles of
    1024 x 1024, 2 threads): as much time as the bfloat16 products saved."""
    if tile.device.type != "cpu":  # an accelerator's amax is fast; the check below would wait on it
        return tile.amax(1)
    bits = tile.view(BITS[tile.dtype])
    highest = bits.amax(1)
    if bool((highest >= 0).all()):  # the usual case: the second pass (amin) is not needed
        return highest.view(tile.dtype)
    return torch.where(highest >= 0, highest, bits.amin(1)).view(tile.dtype)
