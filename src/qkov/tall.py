"""A vocabulary-long matrix that is never held whole in its compute dtype (:class:`TallMatrix`).

At Llama-3.1-70B's width the embedding and the unembedding are ``128,256 x 8,192`` each: 3.9 GiB in
float32, 7.8 GiB together, against 3.9 GiB as they are stored (bfloat16). The full circuits of the
paper (``W_E W_OV W_U``, ``W_E W_QK W_E^T``) read them only through ``d_model``-sized products,
the Gram matrices ``W_E^T W_E`` and ``W_U W_U^T`` and the cross product ``W_U W_E`` (section
"Summarizing OV/QK Matrices"; :class:`qkov.linalg.SharedFactoredMatrix`), which are sums over the
vocabulary: each can be accumulated from a block of rows at a time, widened as it is read. A
:class:`TallMatrix` is that matrix: its rows come from ``read(start, stop)`` (a narrow stored tensor
converted, and folded, as the model read whole folds it), and only :data:`~qkov.linalg.GRAM_ROWS`
of them are held at once.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from jaxtyping import Float
from torch import Tensor

from qkov.errors import QkovError

Reader = Callable[[int, int], Tensor]  # rows [start, stop) of the [m, d] matrix, in its compute dtype


class TallMatrix:
    """The matrix ``[m, d]`` whose rows ``start:stop`` are ``read(start, stop)`` (``dtype``, on
    ``device``), or with ``transposed`` its transpose ``[d, m]`` (``.mT`` flips it: the
    unembedding is the transpose of its ``d_vocab`` rows). Indexing gives a block of the long
    dimension as a tensor (``X[a:b]``, or ``X[:, a:b]`` transposed): what
    :func:`~qkov.linalg.wide_gram` and :func:`~qkov.linalg.wide_product` read. A product with a
    tensor is built a block at a time (it is as long as the vocabulary; asked for only by analyses
    that build ``d_vocab``-long factors). ``grams``: the Gram matrices computed of it, kept for its
    life (shared with its transpose and conversions: the same numbers)."""

    def __init__(
        self,
        read: Reader,
        shape: tuple[int, int],
        dtype: torch.dtype,
        device: torch.device,
        transposed: bool = False,
        grams: dict | None = None,
    ) -> None:
        self.read, self.rows_shape, self.dtype, self.device = read, tuple(shape), dtype, torch.device(device)
        self.transposed, self.grams = transposed, {} if grams is None else grams

    @property
    def shape(self) -> torch.Size:
        return torch.Size(self.rows_shape[::-1] if self.transposed else self.rows_shape)

    @property
    def ndim(self) -> int:
        return 2

    @property
    def mT(self) -> TallMatrix:  # noqa: N802 (Tensor's name)
        flipped = not self.transposed
        return TallMatrix(self.read, self.rows_shape, self.dtype, self.device, flipped, self.grams)

    def same_as(self, other: object) -> bool:
        """Whether ``other`` is this matrix, in the same orientation and dtype."""
        return (
            isinstance(other, TallMatrix)
            and other.read is self.read
            and other.transposed == self.transposed
            and other.dtype == self.dtype
        )

    def apply(self, move: Callable[[Tensor], Tensor]) -> TallMatrix:
        """This matrix with ``move`` (a ``Module._apply`` function: ``.to(device)``, ``.double()``...)
        made on each block as it is read."""
        probe = move(torch.empty(0, dtype=self.dtype, device=self.device))
        if probe.dtype == self.dtype and probe.device == self.device:
            return self  # its blocks as they are (and the Gram matrices computed of them)
        read = self.read

        def moved(start: int, stop: int) -> Tensor:
            return move(read(start, stop))

        return TallMatrix(moved, self.rows_shape, probe.dtype, probe.device, self.transposed)

    def to(self, dtype: torch.dtype) -> TallMatrix:
        return self if dtype == self.dtype else self.apply(lambda x: x.to(dtype))

    def __getitem__(self, key: object) -> Tensor:
        """A block of the long dimension: ``X[a:b]`` (rows), or ``X[:, a:b]`` when transposed."""
        if self.transposed and isinstance(key, tuple) and len(key) == 2 and key[0] == slice(None):
            key, flip = key[1], True
        else:
            flip = False
        if not isinstance(key, slice) or key.step not in (None, 1) or flip != self.transposed:
            raise QkovError(f"a TallMatrix {tuple(self.shape)} is read by blocks of its long dimension only")
        start, stop, _ = key.indices(self.rows_shape[0])
        rows = self.read(start, max(start, stop))
        return rows.mT if flip else rows

    def blocks(self, size: int):
        """``(start, rows)`` for each block of ``size`` rows (untransposed: ``[b, d]``)."""
        for start in range(0, self.rows_shape[0], size):
            yield start, self.read(start, min(start + size, self.rows_shape[0]))

    def __matmul__(self, other: Tensor) -> Float[Tensor, "... m k"]:
        """``X @ other`` for ``X [m, d]`` (untransposed), block by block."""
        if self.transposed or not isinstance(other, Tensor):
            return NotImplemented
        return torch.cat([rows @ other for _, rows in self.blocks(BLOCK_ROWS)], dim=-2)

    def __rmatmul__(self, other: Tensor) -> Float[Tensor, "... k m"]:
        """``other @ X`` for ``X [d, m]`` (transposed), block by block."""
        if not self.transposed or not isinstance(other, Tensor):
            return NotImplemented
        return torch.cat([other @ rows.mT for _, rows in self.blocks(BLOCK_ROWS)], dim=-1)

    def __repr__(self) -> str:
        return f"TallMatrix(shape={tuple(self.shape)}, dtype={self.dtype}, read a block at a time)"


BLOCK_ROWS = 4096  # rows of a product built a block at a time
