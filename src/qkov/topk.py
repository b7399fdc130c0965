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
- *search*: row leaves in order of their best bound; a leaf's rows are multiplied (float32) only
  with the column leaves whose bound reaches the current ``k``-th best value ``tau``, and the
  search stops when no bound does. A flat spectrum prunes little, and the cost falls back to the
  exhaustive product plus bounds that cost ``LEAD / d_head`` of it.

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
- ties: equal float64 values are ordered by position (smaller row-major index first), as a stable
  sort of the dense product would order them.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from jaxtyping import Float, Int
from torch import Tensor

LEAD = 8  # leading singular coordinates boxed per leaf; the rest bounded by Cauchy-Schwarz
LEAF = 128  # rows or columns per leaf: 128 x 50257 float32 entries (25 MiB) per screening block
FIRST_COLUMNS = 2048  # per row leaf, columns screened first to set each row's own k-th best
ROOT_CUTOFF = 1e-10  # Gram eigenvalues below this fraction of the largest: a direction dropped
BOUND_ROWS = 4096  # rows whose bounds are computed at once (4096 x 393 leaves: 13 MiB)
DECIDE_CHUNK = 16384  # candidates decided at once: 2 x 8 MiB of gathered float64 rows at r = 64
DENSE_FRACTION = 0.5
SCREEN = torch.float32
UNIT_ROUNDOFF = 2.0**-24  # of SCREEN
DECIDE = torch.float64


class _Leaves(NamedTuple):
    """One side (rows of ``A B`` or its columns) in leaf order, with each leaf's box."""

    order: Int[Tensor, "N"]  # leaf-ordered position -> original row (column)
    leaf_of: Int[Tensor, "N"]  # leaf of each leaf-ordered position
    starts: list[int]  # first position of each leaf, then N
    lead: Float[Tensor, "N p"]
    slack: Float[Tensor, "N 3"]  # nonnegative terms whose products bound the rest (see _basis)
    norm: Float[Tensor, "N"]  # ||a_i|| (||b_j||): the float32 screening error's scale
    lo: Float[Tensor, "L p"]
    hi: Float[Tensor, "L p"]
    slack_max: Float[Tensor, "L 3"]

    @property
    def box(self) -> Float[Tensor, "2p+3 L"]:
        """What a row's ``[max(p, 0), max(-p, 0), slack]`` is multiplied by for its bound."""
        return torch.cat([self.hi, -self.lo, self.slack_max], 1).mT


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


def _prepare(A: Float[Tensor, "m r"], B: Float[Tensor, "r n"], row_leaf: int) -> _Search:
    """The basis, both sides' leaves and the factors in leaf order (see the module docstring)."""
    a, b = A.detach().to(DECIDE), B.detach().to(DECIDE)
    P, Q, row_slack, col_slack = _basis(a, b)
    rows = _leaves(P, row_slack, a.norm(dim=1), row_leaf)
    cols = _leaves(Q, col_slack, b.norm(dim=0), LEAF)
    a, b = a[rows.order], b.mT[cols.order]
    screen = SCREEN if _screen_is_ieee(A.device) else DECIDE
    unit = UNIT_ROUNDOFF if screen == SCREEN else torch.finfo(DECIDE).eps / 2
    gamma = _gamma(A.shape[1] + 3, unit)
    buffer = torch.empty(row_leaf * b.shape[0], dtype=screen, device=b.device)
    return _Search(rows, cols, a.to(screen), b.mT.to(screen).contiguous(), a, b, buffer, gamma)


def _screen_is_ieee(device: torch.device) -> bool:
    """float32 matmuls round as IEEE float32 (not TF32 or bfloat16, which a GPU may be set to use)."""
    return device.type == "cpu" or torch.get_float32_matmul_precision() == "highest"


def _bounds(search: _Search, rows: slice) -> Float[Tensor, "b L"]:
    """An upper bound on each row's entries in each column leaf."""
    lead, cols = search.rows.lead[rows], search.cols
    terms = torch.cat([lead.clamp_min(0), (-lead).clamp_min(0), search.rows.slack[rows]], 1)
    return terms @ cols.box


def _columns(search: _Search, live: Tensor) -> Int[Tensor, "c"]:
    """Leaf-ordered positions of the columns in the ``live`` column leaves; every column when
    they hold more than ``DENSE_FRACTION`` of them (screening the rest too costs less than
    gathering the live ones)."""
    cols = live[search.cols.leaf_of].nonzero().squeeze(1)
    if len(cols) > DENSE_FRACTION * len(live[search.cols.leaf_of]):
        return torch.arange(len(search.cols.order), device=cols.device)
    return cols


def _decide(search: _Search, rows: Tensor, cols: Tensor) -> Float[Tensor, "c"]:
    """Exact (float64) entries at leaf-ordered ``(rows, cols)``, one dot product each (the same
    value whatever block an entry was screened in), ``DECIDE_CHUNK`` at a time."""
    return torch.cat(
        [
            (
                search.a_decide[rows[at : at + DECIDE_CHUNK]] * search.b_decide[cols[at : at + DECIDE_CHUNK]]
            ).sum(1)
            for at in range(0, len(rows), DECIDE_CHUNK)
        ]
        or [search.a_decide.new_empty(0)]
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
    A: Float[Tensor, "m r"], B: Float[Tensor, "r n"], k: int, row_leaf: int = LEAF
) -> tuple[Float[Tensor, "k"], Int[Tensor, "k"]]:
    """The ``k`` largest entries of ``A @ B`` (float64, descending) and their row-major indices,
    exactly (see the module docstring); ``row_leaf`` rows are screened at a time."""
    search = _prepare(A, B, row_leaf)
    starts = search.rows.starts
    leaves = [slice(start, end) for start, end in zip(starts, starts[1:], strict=False)]
    leaf_bound = _leaf_bounds(search)
    values = torch.empty(0, dtype=DECIDE, device=A.device)
    index = torch.empty(0, dtype=torch.long, device=A.device)
    for leaf in leaf_bound.argsort(descending=True).tolist():
        tau = float(values[-1]) if len(values) == k else -torch.inf
        if leaf_bound[leaf] < tau:
            break  # every remaining leaf's bound is lower still
        found_values, found_index = _leaf_candidates(search, leaves[leaf], tau, k, B.shape[1])
        values, index = _ranked(torch.cat([values, found_values]), torch.cat([index, found_index]), k)
    return values, index


def _leaf_bounds(search: _Search) -> Float[Tensor, "L"]:
    """Each row leaf's bound on its entries, from its rows' bounds, ``BOUND_ROWS`` rows at a time."""
    m = len(search.rows.order)
    best = torch.cat([_bounds(search, slice(s, s + BOUND_ROWS)).amax(1) for s in range(0, m, BOUND_ROWS)])
    return _per_part(best[:, None], search.rows.leaf_of, len(search.rows.starts) - 1, "amax")[:, 0]


def _leaf_candidates(search: _Search, rows: slice, tau: float, k: int, n: int) -> tuple[Tensor, Tensor]:
    """Entries of one row leaf that can beat ``tau`` (or, before ``k`` are held, be among the
    leaf's ``k`` best), decided in float64, with their row-major indices."""
    live = _columns(search, (_bounds(search, rows) >= tau).any(0))
    if live.numel() == 0:
        return search.a_decide.new_empty(0), live
    screened = _screen(search, rows, live)
    error = search.gamma * search.rows.norm[rows].max() * search.cols.norm[live].max()
    if tau > -torch.inf:
        threshold = torch.tensor(tau, dtype=DECIDE, device=live.device) - error
    elif screened.numel() >= k:
        threshold = _kth(screened.flatten(), k).to(DECIDE) - 2 * error
    else:
        threshold = torch.tensor(-torch.inf, dtype=DECIDE, device=live.device)
    best = screened.amax(1)  # one pass; only rows holding a candidate are compared
    hot = (best >= _at_most(threshold, screened.dtype)).nonzero()[:, 0]
    at_row, at_col = (screened[hot] >= _at_most(threshold, screened.dtype)).nonzero().unbind(1)
    at_row = hot[at_row]
    positions, cols = at_row + rows.start, live[at_col]
    exact = _decide(search, positions, cols)
    return exact, search.rows.order[positions] * n + search.cols.order[cols]


@torch.no_grad()
def largest_per_row(
    A: Float[Tensor, "m r"], B: Float[Tensor, "r n"], k: int, row_leaf: int = LEAF
) -> tuple[Float[Tensor, "m k"], Int[Tensor, "m k"]]:
    """Each row's ``k`` largest entries of ``A @ B`` (float64, descending; equal values by column)
    and their columns, exactly (see the module docstring); ``row_leaf`` rows at a time."""
    search = _prepare(A, B, row_leaf)
    values = torch.empty(A.shape[0], k, dtype=DECIDE, device=A.device)
    cols = torch.empty(A.shape[0], k, dtype=torch.long, device=A.device)
    starts = search.rows.starts
    for start, end in zip(starts, starts[1:], strict=False):
        found = _row_leaf_best(search, slice(start, end), k)
        values[search.rows.order[start:end]], cols[search.rows.order[start:end]] = found
    return values, cols


def _row_leaf_best(search: _Search, rows: slice, k: int) -> tuple[Tensor, Tensor]:
    """The ``k`` best entries of each row of one row leaf: the columns of the best-bounded column
    leaves first, which give each row a ``tau``; then every column leaf whose bound reaches it.
    A row's candidates are its entries within ``2 error`` of the larger of the two blocks'
    ``k``-th best (each block's ``k`` best beat anything below that by more than the error)."""
    bounds = _bounds(search, rows)
    first = _first_leaves(search, bounds.amax(0), k)
    parts = [(_columns(search, first),)]
    parts[0] += (_screen(search, rows, parts[0][0]),)
    error = search.gamma * search.rows.norm[rows] * search.cols.norm.max()
    kth = _kth(parts[0][1], k).to(DECIDE)
    n = len(search.cols.order)
    live = ((bounds >= (kth - error)[:, None]) & ~first).any(0)
    more = _columns(search, live) if len(parts[0][0]) < n else live.new_empty(0, dtype=torch.long)
    if len(more) == n:  # nearly every column: screen them all, once
        parts = [(more, _screen(search, rows, more))]
        kth = _kth(parts[0][1], k).to(DECIDE)
    elif more.numel():
        parts.append((more, _screen(search, rows, more, parts[0][1].numel())))
        if more.numel() >= k:
            kth = kth.maximum(_kth(parts[1][1], k).to(DECIDE))
    threshold = _at_most(kth - 2 * error, parts[0][1].dtype)
    found = [
        (at_row, cols[at_col])
        for cols, screened in parts
        for at_row, at_col in [(screened >= threshold[:, None]).nonzero().unbind(1)]
    ]
    at_row, at_col = (torch.cat(x) for x in zip(*found, strict=True))
    exact = _decide(search, at_row + rows.start, at_col)
    return _ranked_per_row(at_row, search.cols.order[at_col], exact, rows.stop - rows.start, k)


def _first_leaves(search: _Search, bound: Float[Tensor, "L"], k: int) -> Tensor:
    """The best-bounded column leaves holding at least ``max(k, FIRST_COLUMNS)`` columns."""
    sizes = torch.tensor(search.cols.starts, device=bound.device).diff()
    order = bound.argsort(descending=True)
    count = int((sizes[order].cumsum(0) < max(k, FIRST_COLUMNS)).sum()) + 1
    first = torch.zeros(len(sizes), dtype=torch.bool, device=bound.device)
    first[order[:count]] = True
    return first


def _ranked_per_row(
    row: Int[Tensor, "c"], col: Int[Tensor, "c"], value: Float[Tensor, "c"], b: int, k: int
) -> tuple[Float[Tensor, "b k"], Int[Tensor, "b k"]]:
    """Per row (each with at least ``k`` candidates), the first ``k`` by value, equal values by column."""
    order = col.argsort(stable=True)
    order = order[value[order].argsort(descending=True, stable=True)]
    order = order[row[order].argsort(stable=True)]
    counts = torch.bincount(row, minlength=b)
    take = (counts.cumsum(0) - counts)[:, None] + torch.arange(k, device=row.device)
    return value[order][take], col[order][take]
