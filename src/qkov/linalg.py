"""Exact low-rank algebra: :class:`FactoredMatrix` stands for ``A @ B`` and never builds it unless
asked (section "Summarizing OV/QK Matrices" and the appendix on low-rank matrices).

Every circuit of the paper is such a product: the QK circuit ``W_E W_Q W_K^T W_E^T``, the OV circuit
``W_E W_V W_O W_U`` (row-vector forms of the paper's ``W_E^T W_QK W_E`` and ``W_U W_OV W_E``). Over a
50k vocabulary they have 2.5 billion entries, yet rank at most ``d_head``. Each quantity below is
computed in the small space *where that is exact*:

- ``A = Q_A R_A`` and ``B^T = Q_B R_B`` (thin QR) give ``A B = Q_A (R_A R_B^T) Q_B^T`` with
  orthonormal ``Q_A``, ``Q_B``: the Frobenius norm, the singular values and the rank of ``A B`` are
  those of the small *core* ``R_A R_B^T``, and its singular vectors map back through ``Q_A``, ``Q_B``;
- eigenvalues: ``A B v = l v`` implies ``B A (B v) = l (B v)``, so the nonzero eigenvalues of
  ``A B`` (``m x m``) are those of ``B A`` (``r x r``); so is the trace. The Frobenius norm is *not*
  invariant under this reordering (``||AB||_F != ||BA||_F`` in general): the paper's published
  correction came from exactly that shortcut, and nothing here takes it.

Leading dimensions broadcast, so one object can hold every head's circuit (``[n_layers, n_heads,
m, n]``). :class:`SharedFactoredMatrix` is such a batch between outer factors that every matrix
shares (``W_E`` and ``W_U`` in the full circuits, the paper's ``W_U W_OV W_E``): square roots of
their Gram matrices are taken once for the whole batch, and no vocabulary-long factor is built per head.
"""

from __future__ import annotations

import functools
import weakref
from typing import NamedTuple

import torch
from jaxtyping import Complex, Float, Int
from torch import Tensor

from qkov.errors import QkovError
from qkov.tall import TallMatrix
from qkov.topk import LEAF, largest_entries

DEFAULT_MEMORY_BYTES = 2**30  # the top-k budget: at most about 1 GiB of product entries at once
BLOCK_BYTES = 16 * 2**20  # a block of streamed rows that stays in cache (larger blocks are slower)
# The Gram matrix of a float32 outer factor is formed in float64, whose square-root error (sqrt(eps_64)
# = 1.5e-8) is below float32 rounding: see outer_root.
WIDER = {torch.float32: torch.float64}
GRAM_ROWS = 2048  # rows widened at once, into one reused buffer: 12 MiB of float64 at d_model 768
# Columns below which a block of the Gram matrix is one full product: GPT-2's W_E in float64, 1
# thread, 0.77 s with 96 (192: 0.83 s, 384: 0.97 s; 4 x 4 flat blocks 0.83 s; one product 1.18 s).
GRAM_LEAF = 96


class TopK(NamedTuple):
    """The ``k`` largest (or smallest) entries of a product and where they are."""

    values: Float[Tensor, "... k"]
    rows: Int[Tensor, "... k"]
    cols: Int[Tensor, "... k"]


class FactoredMatrix:
    """The matrix ``A @ B`` with ``A [..., m, r]`` and ``B [..., r, n]``, kept factored.

    ``m`` is the number of rows, ``n`` of columns and ``r`` the inner (hidden) dimension; leading
    dimensions of ``A`` and ``B`` broadcast against each other.
    """

    def __init__(self, A: Float[Tensor, "... m r"], B: Float[Tensor, "... r n"]) -> None:
        if not (isinstance(A, Tensor) and isinstance(B, Tensor)):
            raise QkovError("FactoredMatrix needs two tensors")
        if A.ndim < 2 or B.ndim < 2:
            raise QkovError(
                f"FactoredMatrix factors must be matrices, got shapes {tuple(A.shape)}, {tuple(B.shape)}"
            )
        if A.shape[-1] != B.shape[-2]:
            raise QkovError(
                f"FactoredMatrix inner dimensions differ: A {tuple(A.shape)} @ B {tuple(B.shape)}"
            )
        try:
            batch = torch.broadcast_shapes(A.shape[:-2], B.shape[:-2])
        except RuntimeError:
            raise QkovError(
                f"FactoredMatrix leading dimensions do not broadcast: {tuple(A.shape)} and {tuple(B.shape)}"
            ) from None
        dtype = torch.promote_types(A.dtype, B.dtype)
        self.A = A.to(dtype).expand(*batch, *A.shape[-2:])
        self.B = B.to(dtype).expand(*batch, *B.shape[-2:])

    # -- shape -----------------------------------------------------------------------------------
    @property
    def batch_shape(self) -> torch.Size:
        return self.A.shape[:-2]

    @property
    def shape(self) -> torch.Size:
        return torch.Size((*self.batch_shape, self.m, self.n))

    @property
    def m(self) -> int:
        """Rows of the product."""
        return self.A.shape[-2]

    @property
    def r(self) -> int:
        """The inner dimension: an upper bound on the rank."""
        return self.A.shape[-1]

    @property
    def n(self) -> int:
        """Columns of the product."""
        return self.B.shape[-1]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def dtype(self) -> torch.dtype:
        return self.A.dtype

    def __repr__(self) -> str:
        return f"FactoredMatrix(shape={tuple(self.shape)}, inner={self.r}, dtype={self.dtype})"

    def to(self, dtype: torch.dtype) -> FactoredMatrix:
        return FactoredMatrix(self.A.to(dtype), self.B.to(dtype))

    # -- algebra ---------------------------------------------------------------------------------
    @property
    def AB(self) -> Float[Tensor, "... m n"]:
        """The dense product. It can be huge (``m x n``): only when asked."""
        return self.A @ self.B

    @property
    def BA(self) -> Float[Tensor, "... r r"]:
        """The reordered product ``B @ A`` (square products only): same eigenvalues and trace as
        ``A @ B``, *not* the same norm."""
        self._require_square("BA")
        return self.B @ self.A

    @property
    def T(self) -> FactoredMatrix:
        return FactoredMatrix(self.B.mT, self.A.mT)

    def __matmul__(self, other: Tensor | FactoredMatrix) -> FactoredMatrix | Tensor:
        """``(A B) @ other``: factored for a matrix, dense for a vector (one ``[..., m]`` vector per
        matrix of the batch). The result keeps the smallest inner dimension available."""
        if isinstance(other, FactoredMatrix):
            return _chain(self, other)
        if not isinstance(other, Tensor):
            return NotImplemented
        if other.ndim == 1:
            if other.shape[0] != self.n:
                raise QkovError(f"cannot multiply {tuple(self.shape)} by {tuple(other.shape)}")
            return (self.A @ (self.B @ other)[..., None])[..., 0]
        if other.shape[-2] != self.n:
            raise QkovError(f"cannot multiply {tuple(self.shape)} by {tuple(other.shape)}")
        _check_batches(self.shape, other.shape)
        return FactoredMatrix(self.A, self.B @ other) if self.r <= self.n else FactoredMatrix(self.AB, other)

    def __rmatmul__(self, other: Tensor) -> FactoredMatrix | Tensor:
        """``other @ (A B)``: factored for a matrix, dense for a vector (one ``[..., n]`` vector per
        matrix of the batch)."""
        if not isinstance(other, Tensor):
            return NotImplemented
        if other.ndim == 1:
            if other.shape[0] != self.m:
                raise QkovError(f"cannot multiply {tuple(other.shape)} by {tuple(self.shape)}")
            return ((other @ self.A)[..., None, :] @ self.B)[..., 0, :]
        if other.shape[-1] != self.m:
            raise QkovError(f"cannot multiply {tuple(other.shape)} by {tuple(self.shape)}")
        _check_batches(other.shape, self.shape)
        return FactoredMatrix(other @ self.A, self.B) if self.r <= self.m else FactoredMatrix(other, self.AB)

    def __mul__(self, scalar: float | Tensor) -> FactoredMatrix:
        if isinstance(scalar, Tensor) and scalar.numel() != 1:
            raise QkovError(
                f"a FactoredMatrix can be scaled by a scalar only, got shape {tuple(scalar.shape)}"
            )
        if not isinstance(scalar, int | float | Tensor):
            return NotImplemented
        return FactoredMatrix(self.A * scalar, self.B)

    __rmul__ = __mul__

    def __truediv__(self, scalar: float | Tensor) -> FactoredMatrix:
        return self * (1.0 / scalar)

    def __neg__(self) -> FactoredMatrix:
        return self * -1

    # -- indexing --------------------------------------------------------------------------------
    def __getitem__(self, key: object) -> FactoredMatrix | Tensor:
        """Index leading dimensions, rows and columns, staying factored.

        ``fm[l, h]`` picks one head; ``fm[..., rows, :]`` and ``fm[..., :, cols]`` keep the selected
        rows or columns (slices, lists, tensors). An integer row or column gives a dense tensor
        (one row or column of the product).
        """
        batch_key, row, col = self._split_key(key)
        A = self.A[(*batch_key, slice(None), slice(None))]
        B = self.B[(*batch_key, slice(None), slice(None))]
        A, B = A[..., row, :], B[..., :, col]
        if isinstance(row, int) and isinstance(col, int):
            return (A * B).sum(-1)
        if isinstance(row, int):
            return (A.unsqueeze(-2) @ B).squeeze(-2)
        if isinstance(col, int):
            return (A @ B.unsqueeze(-1)).squeeze(-1)
        return FactoredMatrix(A, B)

    def _split_key(self, key: object) -> tuple[tuple, object, object]:
        key = key if isinstance(key, tuple) else (key,)
        if any(k is None for k in key):
            raise QkovError("FactoredMatrix indexing does not add dimensions (None)")
        ellipses = [i for i, k in enumerate(key) if k is Ellipsis]
        if len(ellipses) > 1:
            raise QkovError("an index can have only one ellipsis")
        if ellipses:
            i = ellipses[0]
            key = key[:i] + (slice(None),) * (self.ndim - len(key) + 1) + key[i + 1 :]
        if len(key) > self.ndim:
            raise QkovError(
                f"too many indices ({len(key)}) for a FactoredMatrix of shape {tuple(self.shape)}"
            )
        key = key + (slice(None),) * (self.ndim - len(key))
        return key[:-2], key[-2], key[-1]

    # -- exact quantities, computed small -------------------------------------------------------
    def _core(self) -> tuple[Tensor, Tensor, Tensor]:
        """``(Q_A, core, Q_B)`` with ``A B = Q_A @ core @ Q_B^T`` and orthonormal columns in
        ``Q_A [m, k1]``, ``Q_B [n, k2]``; ``core = R_A R_B^T`` is ``[k1, k2]``, ``k = min(r, m or n)``."""
        Q_A, R_A = torch.linalg.qr(self.A)
        Q_B, R_B = torch.linalg.qr(self.B.mT)
        return Q_A, R_A @ R_B.mT, Q_B

    def _core_only(self) -> Tensor:
        """The core ``R_A R_B^T`` alone (QR without forming Q): the singular values of ``A B``."""
        return torch.linalg.qr(self.A, mode="r").R @ torch.linalg.qr(self.B.mT, mode="r").R.mT

    def norm(self) -> Float[Tensor, "..."]:
        """The Frobenius norm of ``A @ B``, exactly: that of the small core ``R_A R_B^T``."""
        return torch.linalg.matrix_norm(self._core_only())

    def svd(self) -> tuple[Float[Tensor, "... m k"], Float[Tensor, "... k"], Float[Tensor, "... k n"]]:
        """``U, S, Vh`` with ``U @ diag(S) @ Vh == A @ B``, ``k = min(m, n, r)``, singular values
        descending. ``Vh`` is the conjugate transpose of the right singular vectors, as in
        ``torch.linalg.svd``."""
        Q_A, core, Q_B = self._core()
        U, S, Vh = torch.linalg.svd(core, full_matrices=False)
        return Q_A @ U, S, Vh @ Q_B.mT

    def singular_values(self) -> Float[Tensor, "... k"]:
        """The singular values of ``A @ B``, descending, ``k = min(m, n, r)``: those of the core."""
        return torch.linalg.svdvals(self._core_only())

    @property
    def rank(self) -> Int[Tensor, "..."]:
        """The numerical rank of ``A @ B``, with the same tolerance as a dense
        ``torch.linalg.matrix_rank`` of the product (``S.max() * max(m, n) * eps``)."""
        return numerical_rank(self.singular_values(), self.m, self.n)

    def eigenvalues(self) -> Complex[Tensor, "... k"]:
        """Eigenvalues of the square product ``A @ B`` that can be nonzero, ``k = min(m, r)``.

        From the ``r x r`` matrix ``B A`` when ``r <= m`` (same nonzero eigenvalues); the other
        ``m - r`` eigenvalues of ``A B`` are zero. Complex, since ``A B`` is not symmetric.
        """
        self._require_square("eigenvalues")
        small = self.B @ self.A if self.r <= self.m else self.A @ self.B
        return torch.linalg.eigvals(small)

    def trace(self) -> Float[Tensor, "..."]:
        """``tr(A B) = sum_ij A_ij B_ji``, without the product."""
        self._require_square("trace")
        return torch.einsum("...ij,...ji->...", self.A, self.B)

    def diagonal(self) -> Float[Tensor, "... m"]:
        """The diagonal of ``A @ B``: row ``i`` of ``A`` dotted with column ``i`` of ``B``."""
        self._require_square("diagonal")
        return (self.A * self.B.mT).sum(-1)

    def _require_square(self, what: str) -> None:
        if self.m != self.n:
            raise QkovError(f"{what} needs a square matrix, got {self.m} x {self.n}")

    # -- reading the largest entries ---------------------------------------------------------
    def _rows_per_block(self, memory_bytes: int, most: int) -> int:
        """Rows of the product computed at once: within ``memory_bytes`` and ``most`` rows."""
        return max(1, min(self.m, most, memory_bytes // (self.n * self.A.element_size())))

    @torch.no_grad()
    def topk(self, k: int, largest: bool = True, memory_bytes: int = DEFAULT_MEMORY_BYTES) -> TopK:
        """The ``k`` largest (or smallest) entries of ``A @ B`` over all rows and columns, per
        matrix, sorted, with their row and column indices; equal values in row-major order.

        Exact, and where the product's spectrum allows, most of the ``m x n`` entries are never
        computed: bounds from its singular coordinates rule out whole blocks, the rest are screened
        (in float32, or bfloat16 on a CPU where that pays) and the boundary cases decided in
        float64; where the bounds would rule out too little (a flat spectrum), the product is
        streamed whole, its boundary cases decided in float64 too (:func:`qkov.topk.largest_entries`,
        whose docstring states the rule and the error bounds). Values are the float64 entries in this
        matrix's dtype. Memory: a block of at most ``memory_bytes`` (and 128 rows) at a time, never
        the product.
        """
        if not 1 <= k <= self.m * self.n:
            raise QkovError(f"k must lie in [1, {self.m * self.n}], got {k}")
        leaf = self._rows_per_block(memory_bytes, LEAF)
        block = self._rows_per_block(min(memory_bytes, BLOCK_BYTES), self.m)
        A = self.A.detach().reshape(-1, self.m, self.r)
        B = self.B.detach().reshape(-1, self.r, self.n)
        found = [largest_entries(a, b, k, leaf, block) for a, b in zip(A if largest else -A, B, strict=True)]
        sign = 1 if largest else -1
        values = torch.stack([sign * v for v, _ in found]).to(self.dtype).reshape(*self.batch_shape, k)
        index = torch.stack([i for _, i in found]).reshape(*self.batch_shape, k)
        return TopK(values, index // self.n, index % self.n)

    @torch.no_grad()
    def topk_per_row(
        self, k: int, largest: bool = True, memory_bytes: int = DEFAULT_MEMORY_BYTES
    ) -> tuple[Float[Tensor, "... m k"], Int[Tensor, "... m k"]]:
        """For every row of ``A @ B``, its ``k`` largest (or smallest) entries and their columns
        (for a QK circuit: the tokens each token most wants to attend to): each row of the product
        as this dtype's matmul computes it, in ``torch.topk``'s order (equal values included).

        Streamed a block of at most ``memory_bytes`` (and 16 MiB) at a time into one reused buffer,
        the results written into the ``m x k`` outputs: those and the block are all it holds.
        (Pruning does not pay here: each row's own ``k``-th best is a weak bound, and 65-75% of a
        trained-like product's entries would still be screened; ``benchmarks/README.md``.)"""
        if not 1 <= k <= self.n:
            raise QkovError(f"k must lie in [1, {self.n}], got {k}")
        step = self._rows_per_block(min(memory_bytes, BLOCK_BYTES), self.m)
        A = self.A.detach().reshape(-1, self.m, self.r)
        B = self.B.detach().reshape(-1, self.r, self.n)
        values = torch.empty(len(A), self.m, k, dtype=self.dtype, device=self.A.device)
        cols = torch.empty(len(A), self.m, k, dtype=torch.long, device=self.A.device)
        buffer = torch.empty(step, self.n, dtype=self.dtype, device=self.A.device)
        for a, b, v, c in zip(A, B, values, cols, strict=True):
            for start in range(0, self.m, step):
                rows = slice(start, start + step)
                block = torch.matmul(a[rows], b, out=buffer[: len(v[rows])])
                torch.topk(block, k, dim=-1, largest=largest, out=(v[rows], c[rows]))
        return values.reshape(*self.batch_shape, self.m, k), cols.reshape(*self.batch_shape, self.m, k)


def _chain(left: FactoredMatrix, right: FactoredMatrix) -> FactoredMatrix:
    """``(A1 B1)(A2 B2)`` cut at the smallest of its three inner dimensions ``r1``, ``n1 = m2``,
    ``r2``; the middle ``B1 A2`` (``r1 x r2``) is formed first when the cut is at ``r1`` or ``r2``."""
    if left.n != right.m:
        raise QkovError(f"cannot multiply {tuple(left.shape)} by {tuple(right.shape)}")
    _check_batches(left.shape, right.shape)
    smallest = min(left.r, left.n, right.r)
    if smallest == left.n:
        return FactoredMatrix(left.AB, right.AB)
    middle = left.B @ right.A
    if smallest == left.r:
        return FactoredMatrix(left.A, middle @ right.B)
    return FactoredMatrix(left.A @ middle, right.B)


def _check_batches(left: torch.Size, right: torch.Size) -> None:
    """Leading dimensions of two matrix operands must broadcast (a clear error, not torch's)."""
    try:
        torch.broadcast_shapes(left[:-2], right[:-2])
    except RuntimeError:
        raise QkovError(
            f"cannot multiply {tuple(left)} by {tuple(right)}: leading dimensions do not broadcast"
        ) from None


def numerical_rank(S: Float[Tensor, "... k"], m: int, n: int) -> Int[Tensor, "..."]:
    """How many singular values ``S`` (of an ``m x n`` matrix) exceed ``S.max() * max(m, n) * eps``,
    the tolerance of a dense ``torch.linalg.matrix_rank``."""
    if S.shape[-1] == 0:
        return torch.zeros(S.shape[:-1], dtype=torch.long, device=S.device)
    tol = S.amax(-1, keepdim=True) * max(m, n) * torch.finfo(S.dtype).eps
    return (S > tol).sum(-1)


def eigenvalue_positivity(eigenvalues: Complex[Tensor, "... k"]) -> Float[Tensor, "..."]:
    """``Re(sum l) / sum |l|`` over eigenvalues already computed (section "Detecting Copying
    Behavior"): near 1 when the positive eigenvalues dominate, near -1 when the negative ones do,
    and 0 when every eigenvalue is 0. Of a full OV circuit it is the paper's copying score; of the
    token-level K-composition term, the induction test."""
    total = eigenvalues.abs().sum(-1)
    score = eigenvalues.real.sum(-1) / torch.where(total > 0, total, 1.0)
    return torch.where(total > 0, score, 0.0)


def outer_root(X: Float[Tensor, "m d"]) -> Float[Tensor, "k d"]:
    """``R`` with ``R^T R = X^T X``, ``k = min(m, d)``: so ``X Y`` and ``R Y`` have the same singular
    values and Frobenius norm for every ``Y``.

    float32: a root of the Gram matrix ``X^T X`` formed in float64 (:func:`wide_gram`, one symmetric
    matmul: 0.8 s against the QR's 1.5 s for GPT-2's ``W_E``, 1 thread). An error ``E`` in ``X^T X``
    moves a singular value of ``X Y`` by at most ``sqrt(||E||) ||Y||`` (Weyl, on the squares); with
    ``||E||`` about ``eps_64 ||X||^2`` that is ``1.5e-8 ||X|| ||Y||``, under float32 rounding
    (``1.2e-7``), so the root is about as exact as a float32 QR's ``R``. Other dtypes (float64): the
    thin QR ``X = Q R`` (``Q`` never formed), backward stable, which a Gram in the same precision
    is not.
    """
    if isinstance(X, TallMatrix):  # never whole: its Gram, accumulated a block of rows at a time
        return gram_root(float64_gram(X), min(X.shape)).to(X.dtype)
    if X.dtype not in WIDER:
        return torch.linalg.qr(X, mode="r").R
    return gram_root(float64_gram(X).to(WIDER[X.dtype]), min(X.shape)).to(X.dtype)


def float64_gram(X: Float[Tensor, "m d"]) -> Float[Tensor, "d d"]:
    """``X^T X`` in float64 (:func:`wide_gram` for float32 ``X``), remembered for the last
    :data:`KEPT_GRAMS` tensors while they live and are not changed in place: the analyses of one
    model read ``W_E^T W_E`` and ``W_U W_U^T`` several times (spectra's roots, GQA groups, rotary
    bands, the induction check, neurons), each ``2 d_vocab d_model^2`` FLOP (a teraFLOP at Llama 3's
    vocabulary and width 2048). Alive means the tensor ``X`` views is (a parameter, not a detached
    copy of it, whose life ends with the call): while it lives, no other tensor's data is at its
    address. A :class:`~qkov.tall.TallMatrix`'s is kept with it, for its life."""
    if isinstance(X, TallMatrix):
        key = ("gram", X.transposed)
        if key not in X.grams:
            with torch.no_grad():
                X.grams[key] = wide_gram(X).to(torch.float64)
        return X.grams[key]
    base = X if X._base is None else X._base
    key = (X.data_ptr(), tuple(X.shape), tuple(X.stride()), X.dtype, X.device, X._version)
    for stale in [k for k, (alive, _) in _GRAMS.items() if alive() is None]:
        del _GRAMS[stale]  # its tensor is gone: its memory may hold another one now
    if key in _GRAMS:  # its tensor alive (stale ones dropped above): the same memory, the same numbers
        return _GRAMS[key][1]
    with torch.no_grad():
        gram = X.mT @ X if X.dtype == torch.float64 else wide_gram(X).to(torch.float64)
    _GRAMS[key] = (weakref.ref(base), gram)
    while len(_GRAMS) > KEPT_GRAMS:
        del _GRAMS[next(iter(_GRAMS))]
    return gram


KEPT_GRAMS = 2  # an embedding's and an unembedding's
_GRAMS: dict[tuple, tuple[weakref.ref, Tensor]] = {}


def wide_gram(X: Float[Tensor, "m d"] | TallMatrix) -> Float[Tensor, "d d"]:
    """``X^T X`` in the wider precision of :data:`WIDER` (float64 for a :class:`~qkov.tall.TallMatrix`
    of any dtype), ``GRAM_ROWS`` rows widened at a time."""
    m, d = X.shape
    tall = isinstance(X, TallMatrix)
    gram = torch.zeros(d, d, dtype=torch.float64 if tall else WIDER[X.dtype], device=X.device)
    # one buffer, reused (no fresh pages per block), laid out as X is: a transposed view (W_U^T) is
    # copied along its contiguous columns, 4x faster than into rows
    rows = min(GRAM_ROWS, m)
    if not tall and X.stride(0) == 1 and d > 1:
        buffer = torch.empty(d, rows, dtype=gram.dtype, device=X.device).mT
    else:
        buffer = torch.empty(rows, d, dtype=gram.dtype, device=X.device)
    for start in range(0, m, GRAM_ROWS):
        _add_upper_gram(gram, buffer[: min(GRAM_ROWS, m - start)].copy_(X[start : start + GRAM_ROWS]))
    return gram.triu() + gram.triu(1).mT


def _same_tensor(a: Tensor | TallMatrix, b: Tensor | TallMatrix) -> bool:
    """Whether ``a`` and ``b`` view the same memory the same way (two views of one tensor), or are
    the same :class:`~qkov.tall.TallMatrix` in the same orientation."""
    if isinstance(a, TallMatrix) or isinstance(b, TallMatrix):
        return isinstance(a, TallMatrix) and a.same_as(b)
    return (
        a.data_ptr() == b.data_ptr()
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.dtype == b.dtype
    )


def wide_product(
    X: Float[Tensor, "e m"] | TallMatrix, Y: Float[Tensor, "m d"] | TallMatrix, dtype: torch.dtype
) -> Float[Tensor, "e d"]:
    """``X @ Y`` in ``dtype``, :data:`GRAM_ROWS` of the ``m`` inner rows converted at a time (the
    product itself when the factors are tensors in ``dtype`` already)."""
    if isinstance(X, Tensor) and isinstance(Y, Tensor) and X.dtype == dtype and Y.dtype == dtype:
        return X @ Y
    out = torch.zeros(X.shape[0], Y.shape[1], dtype=dtype, device=X.device)
    for start in range(0, Y.shape[0], GRAM_ROWS):
        end = start + GRAM_ROWS
        out.addmm_(X[:, start:end].to(dtype), Y[start:end].to(dtype))
    return out


def _add_upper_gram(gram: Float[Tensor, "d d"], rows: Float[Tensor, "k d"]) -> None:
    """Add ``rows^T rows`` to the upper triangle of ``gram`` (and some of the lower): the two diagonal
    halves recursively and the off-diagonal block once, down to ``GRAM_LEAF`` columns, which is 56%
    of a full product's FLOP at ``d_model`` 768 (a symmetric rank-k update; torch has none)."""
    d = rows.shape[1]
    if d <= GRAM_LEAF:
        gram.addmm_(rows.mT, rows)
        return
    half = d // 2
    _add_upper_gram(gram[:half, :half], rows[:, :half])
    _add_upper_gram(gram[half:, half:], rows[:, half:])
    gram[:half, half:].addmm_(rows[:, :half].mT, rows[:, half:])


def gram_root(gram: Float[Tensor, "... d d"], k: int) -> Float[Tensor, "... k d"]:
    """``R [k, d]`` with ``R^T R = gram`` for a positive semidefinite ``gram`` of rank at most ``k``:
    its Cholesky factor when ``k = d`` and the factorisation succeeds (positive definite), else from
    the eigendecomposition (the ``k`` largest eigenvalues, negative rounding clipped to 0). Both are
    backward stable: ``R^T R`` is ``gram`` up to ``d eps ||gram||``."""
    if k == gram.shape[-1]:
        root, info = torch.linalg.cholesky_ex(gram, upper=True)
        if bool((info == 0).all()):
            return root
    eigenvalues, vectors = torch.linalg.eigh(gram)  # ascending: the k largest are the last
    first = gram.shape[-1] - k
    return eigenvalues[..., first:].clamp_min(0).sqrt()[..., :, None] * vectors[..., :, first:].mT


class SharedFactoredMatrix:
    """The matrices ``L @ (A @ B) @ R``: a batch of :class:`FactoredMatrix` ``A @ B``
    (``[..., d, e]``, inner dimension ``r``) between outer factors ``L [m, d]`` and ``R [e, n]`` that
    every matrix of the batch shares.

    Every full circuit has this form: the full OV circuit ``W_E (W_V W_O) W_U`` and the full QK
    circuit ``W_E (W_Q W_K^T) W_E^T`` of all heads share ``W_E`` and ``W_U``. With roots of their
    Gram matrices, ``R_L^T R_L = L^T L`` and ``R_R^T R_R = R R^T`` (:func:`outer_root`: a QR's ``R``,
    or for float32 a root of the Gram formed in float64), computed once for the whole batch,
    ``||L Y x|| = ||R_L Y x||`` for every ``Y`` and ``x``, so

        ``L A B R`` and the *core* ``(R_L A)(B R_R^T)``

    have the same norm and singular values (``m x n`` against ``min(m, d) x min(n, e)``); and for
    square products the nonzero eigenvalues and the trace are those of the ``r x r`` matrix
    ``B (R L) A`` (``λ(XY) = λ(YX)``), with ``R L`` (``e x d``) computed once.
    Nothing ``m`` or ``n`` long is built per matrix unless asked for (:meth:`factored`). So ``L``
    and ``R`` may be :class:`~qkov.tall.TallMatrix` (``R`` as one's ``.mT``), never held whole in
    the compute dtype: their roots and ``R L`` are accumulated a block of rows at a time.
    """

    def __init__(
        self,
        left: Float[Tensor, "m d"] | TallMatrix,
        inner: FactoredMatrix,
        right: Float[Tensor, "e n"] | TallMatrix,
    ) -> None:
        outer = (Tensor, TallMatrix)
        if not (isinstance(left, outer) and isinstance(right, outer) and isinstance(inner, FactoredMatrix)):
            raise QkovError("SharedFactoredMatrix needs a tensor, a FactoredMatrix and a tensor")
        if left.ndim != 2 or right.ndim != 2:
            raise QkovError(
                f"the shared outer factors must be matrices, got {tuple(left.shape)}, {tuple(right.shape)}"
            )
        if left.shape[1] != inner.m or inner.n != right.shape[0]:
            raise QkovError(
                f"cannot multiply {tuple(left.shape)} @ {tuple(inner.shape)} @ {tuple(right.shape)}"
            )
        dtype = torch.promote_types(torch.promote_types(left.dtype, right.dtype), inner.dtype)
        self.left, self.right, self.inner = left.to(dtype), right.to(dtype), inner.to(dtype)
        self._outer: dict[object, Tensor] = {}  # what depends on the outer factors alone (share_outer)

    def share_outer(self, other: SharedFactoredMatrix) -> SharedFactoredMatrix:
        """This matrix, reading ``other``'s roots and cross product of the same outer factors (computed
        once for all of them): what a pass over a model's layers, one batch of heads at a time,
        needs so that ``W_E``'s and ``W_U``'s ``d_vocab``-long algebra is not repeated per layer."""
        if not (_same_tensor(other.left, self.left) and _same_tensor(other.right, self.right)):
            raise QkovError("share_outer needs matrices with the same outer factors (the same tensors)")
        self._outer = other._outer
        return self

    def outer_only(self) -> SharedFactoredMatrix:
        """An empty batch between the same outer factors, sharing what is computed of them: what a
        pass over a model's layers keeps between layers for :meth:`share_outer`, not a layer's
        heads (nor their cached core)."""
        d, e = self.inner.m, self.inner.n
        empty = FactoredMatrix(self.inner.A.new_zeros(0, d, 1), self.inner.B.new_zeros(0, 1, e))
        return SharedFactoredMatrix(self.left, empty, self.right).share_outer(self)

    def _shared(self, key: object, compute) -> Tensor:
        if key not in self._outer:
            self._outer[key] = compute()
        return self._outer[key]

    @property
    def batch_shape(self) -> torch.Size:
        return self.inner.batch_shape

    @property
    def shape(self) -> torch.Size:
        return torch.Size((*self.batch_shape, self.m, self.n))

    @property
    def m(self) -> int:
        return self.left.shape[0]

    @property
    def n(self) -> int:
        return self.right.shape[1]

    @property
    def dtype(self) -> torch.dtype:
        return self.inner.dtype

    def __repr__(self) -> str:
        return f"SharedFactoredMatrix(shape={tuple(self.shape)}, inner={self.inner.r}, dtype={self.dtype})"

    def to(self, dtype: torch.dtype) -> SharedFactoredMatrix:
        return SharedFactoredMatrix(self.left.to(dtype), self.inner.to(dtype), self.right.to(dtype))

    def __getitem__(self, key: object) -> SharedFactoredMatrix:
        """Index the leading dimensions only (``sfm[l, h]``: one head), sharing the outer factors."""
        key = key if isinstance(key, tuple) else (key,)
        if len(key) > len(self.batch_shape) or any(k is None or k is Ellipsis for k in key):
            raise QkovError(f"a SharedFactoredMatrix of shape {tuple(self.shape)} is indexed by head only")
        inner = FactoredMatrix(self.inner.A[key], self.inner.B[key])
        return SharedFactoredMatrix(self.left, inner, self.right).share_outer(self)

    def factored(self) -> FactoredMatrix:
        """``FactoredMatrix(L A, B R)``: the ``m``- and ``n``-long factors of every matrix, built (on
        request: for the full circuits of all heads they can take gigabytes)."""
        return FactoredMatrix(self.left @ self.inner.A, self.inner.B @ self.right)

    @functools.cached_property
    def core(self) -> FactoredMatrix:
        """``(R_L A)(B R_R^T)``, ``[..., min(m, d), min(n, e)]``: the same singular values and
        Frobenius norm as ``L A B R`` (``Q_L``, ``Q_R`` have orthonormal columns)."""
        return FactoredMatrix(self._left_root @ self.inner.A, self.inner.B @ self._right_root.mT)

    @property
    def _left_root(self) -> Tensor:
        return self._shared("left root", lambda: outer_root(self.left))

    @property
    def _right_root(self) -> Tensor:
        if self._right_is_left_transposed:
            return self._left_root
        return self._shared("right root", lambda: outer_root(self.right.mT))

    @property
    def _right_is_left_transposed(self) -> bool:
        """``R`` is a transposed view of ``L`` (a full QK circuit): one root serves both."""
        return _same_tensor(self.right, self.left.mT)

    def _cross(self, dtype: torch.dtype) -> Float[Tensor, "e d"]:
        """``R L`` in ``dtype``, computed once: the middle of every reordered product ``B (R L) A``.
        In a wider dtype than the factors', :data:`GRAM_ROWS` of the ``m`` rows are widened at a time,
        so that no widened copy of ``L`` or ``R`` (``d_vocab`` long) is ever held."""
        if self._right_is_left_transposed and dtype == self.dtype:
            return self._shared(dtype, lambda: self._left_root.mT @ self._left_root)  # R^T R = L^T L
        return self._shared(dtype, lambda: wide_product(self.right, self.left, dtype))

    @functools.cached_property
    def _singular_values(self) -> Float[Tensor, "... k"]:
        return self.core.singular_values()

    def norm(self) -> Float[Tensor, "..."]:
        """The Frobenius norm of each ``L A B R``, exactly: ``sqrt(sum s^2)`` over the core's singular
        values (computed once for both)."""
        return self._singular_values.square().sum(-1).sqrt()

    def singular_values(self) -> Float[Tensor, "... k"]:
        """Singular values of each ``L A B R``, descending, ``k = min(m, n, d, e, r)``."""
        return self._singular_values.clone()

    def eigenvalues(self, dtype: torch.dtype | None = None) -> Complex[Tensor, "... k"]:
        """The eigenvalues of each square ``L A B R`` that can be nonzero, ``k = min(m, r)``:
        those of ``B (R L) A`` (``r x r``) when ``r <= m``, else of the (then small) product; in
        ``dtype`` when given (float64 for float32 factors: ``R L`` formed in it, without a float64
        copy of the outer factors)."""
        self._require_square("eigenvalues")
        dtype = dtype or self.dtype
        if self.inner.r > self.m:
            return self.to(dtype).factored().eigenvalues()  # r > m: a small vocabulary
        inner = self.inner.to(dtype)
        return torch.linalg.eigvals(inner.B @ self._cross(dtype) @ inner.A)

    def trace(self) -> Float[Tensor, "..."]:
        """``tr(L A B R) = tr(B (R L) A)``."""
        self._require_square("trace")
        return torch.einsum("...ij,...ji->...", self.inner.B @ self._cross(self.dtype), self.inner.A)

    def _require_square(self, what: str) -> None:
        if self.m != self.n:
            raise QkovError(f"{what} needs a square matrix, got {self.m} x {self.n}")
