"""FactoredMatrix against dense float64 products: hypothesis property tests for every operation,
and hand-built matrices with known answers (section "Summarizing OV/QK Matrices")."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qkov
from qkov import FactoredMatrix, linalg
from qkov.tall import TallMatrix

PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SHARED_PROPERTY = settings(PROPERTY, max_examples=30)


@st.composite
def factored(draw, square=False, batch=True):
    """Random factors: batch dimensions (broadcasting), any inner dimension (r > min(m, n) too),
    rank-deficient factors (repeated and zero columns), zero matrices, float32 or float64."""
    seed = draw(st.integers(0, 2**31 - 1))
    gen = np.random.default_rng(seed)
    m = draw(st.integers(1, 7))
    n = m if square else draw(st.integers(1, 7))
    r = draw(st.integers(1, 9))
    batch_shape = tuple(draw(st.lists(st.integers(1, 3), max_size=2))) if batch else ()
    A = gen.standard_normal((*batch_shape, m, r))
    B = gen.standard_normal((*batch_shape, r, n))
    kind = draw(st.sampled_from(["generic", "repeated", "zero-columns", "zero"]))
    if kind == "repeated" and r > 1:
        A[..., :, 1:] = A[..., :, :1] * gen.standard_normal(r - 1)  # rank 1 in A
    elif kind == "zero-columns":
        A[..., :, : r // 2] = 0.0
    elif kind == "zero":
        B[...] = 0.0
    if batch_shape and draw(st.booleans()):  # broadcast: B shared by every leading index
        B = B[(0,) * len(batch_shape)]
    dtype = draw(st.sampled_from([torch.float64, torch.float32]))
    return FactoredMatrix(torch.tensor(A, dtype=dtype), torch.tensor(B, dtype=dtype))


def dense(fm):
    """The product in float64 numpy, from the factors as stored."""
    return np.asarray(fm.A.double().numpy() @ fm.B.double().numpy())


def tolerance(fm):
    """Relative 1e-10 in float64 (1e-5 in float32) of the scale ||A|| ||B||."""
    scale = float(
        torch.linalg.matrix_norm(fm.A.double()).max() * torch.linalg.matrix_norm(fm.B.double()).max()
    )
    return (1e-10 if fm.dtype == torch.float64 else 1e-5) * max(scale, 1e-30)


def close(actual, expected, atol):
    np.testing.assert_allclose(
        np.asarray(actual, dtype=np.complex128 if np.iscomplexobj(actual) else np.float64),
        expected,
        rtol=0,
        atol=atol,
    )


@PROPERTY
@given(factored())
def test_product_and_transpose(fm):
    close(fm.AB.double().numpy(), dense(fm), tolerance(fm))
    close(fm.T.AB.double().numpy(), np.swapaxes(dense(fm), -1, -2), tolerance(fm))
    assert fm.shape == dense(fm).shape


@PROPERTY
@given(factored())
def test_frobenius_norm_is_that_of_the_product(fm):
    close(fm.norm().double().numpy(), np.linalg.norm(dense(fm), axis=(-2, -1)), tolerance(fm))


@PROPERTY
@given(factored())
def test_svd_reconstructs_the_product(fm):
    U, S, Vh = fm.svd()
    k = min(fm.m, fm.n, fm.r)
    assert U.shape[-1] == S.shape[-1] == Vh.shape[-2] == k
    close((U * S[..., None, :] @ Vh).double().numpy(), dense(fm), tolerance(fm))
    expected = np.linalg.svd(dense(fm), compute_uv=False)[..., :k]
    close(S.double().numpy(), expected, tolerance(fm))
    assert torch.all(S[..., :-1] >= S[..., 1:])
    eye = np.eye(k)
    atol = 1e-10 if fm.dtype == torch.float64 else 1e-4
    close(U.mT.double().numpy() @ U.double().numpy(), np.broadcast_to(eye, (*fm.batch_shape, k, k)), atol)


@PROPERTY
@given(factored(square=True))
def test_eigenvalues_match_the_dense_power_sums(fm):
    """sum(l^p) = tr((AB)^p) for every p, whatever the eigenvalues' multiplicities."""
    eigenvalues = fm.eigenvalues().to(torch.complex128).numpy()
    assert eigenvalues.shape[-1] == min(fm.m, fm.r)
    product = dense(fm)
    power = np.broadcast_to(np.eye(fm.m), product.shape)
    scale = max(np.linalg.norm(product, axis=(-2, -1)).max(), 1e-30)
    for p in (1, 2, 3):
        power = power @ product
        expected = np.trace(power, axis1=-2, axis2=-1)
        rel = 1e-9 if fm.dtype == torch.float64 else 1e-4
        close((eigenvalues**p).sum(-1), expected, rel * scale**p * fm.m + 1e-300)


@PROPERTY
@given(factored(square=True))
def test_trace_and_diagonal(fm):
    close(fm.trace().double().numpy(), np.trace(dense(fm), axis1=-2, axis2=-1), tolerance(fm))
    close(fm.diagonal().double().numpy(), np.diagonal(dense(fm), axis1=-2, axis2=-1), tolerance(fm))


@PROPERTY
@given(factored())
def test_rank_matches_the_dense_rank(fm):
    """The rank under numpy's tolerance ``eps * max(m, n) * s_max``; a singular value within a factor
    of 2 of it (an exactly dependent direction, rounded) may count either way."""
    fm = fm.to(torch.float64)
    S = np.linalg.svd(dense(fm), compute_uv=False)
    tol = np.finfo(np.float64).eps * max(fm.m, fm.n) * S[..., :1]
    rank = fm.rank.numpy()
    assert ((S > 2 * tol).sum(-1) <= rank).all() and (rank <= (S > tol / 2).sum(-1)).all()


def leading(draw, batch_shape):
    """Leading dimensions that broadcast against ``batch_shape``: a suffix of it, each size kept
    or 1, or all of them with one more dimension in front."""
    kept = batch_shape[len(batch_shape) - draw(st.integers(0, len(batch_shape))) :]
    shape = tuple(size if draw(st.booleans()) else 1 for size in kept)
    return (2, *shape) if len(kept) == len(batch_shape) and draw(st.booleans()) else shape


@PROPERTY
@given(factored(), st.integers(1, 6), st.data())
def test_matmul_with_every_operand_kind_on_both_sides(fm, k, data):
    """Vectors, matrices, factored matrices and scalars, each with leading dimensions drawn to
    broadcast against the factored matrix's own (a vector multiplies every matrix of the batch)."""
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1)))

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=fm.dtype)

    right = randn(*leading(data.draw, fm.batch_shape), fm.n, k)
    left = randn(*leading(data.draw, fm.batch_shape), k, fm.m)
    other = FactoredMatrix(randn(*leading(data.draw, fm.batch_shape), fm.n, 3), randn(3, k))
    other_left = FactoredMatrix(randn(k, 2), randn(*leading(data.draw, fm.batch_shape), 2, fm.m))
    vector, row_vector = randn(fm.n), randn(fm.m)
    c = data.draw(st.sampled_from([-1.5, 2, torch.tensor(0.5, dtype=fm.dtype)]))
    tol = tolerance(fm) * 100
    expected_right = dense(fm) @ right.double().numpy()
    close((fm @ right).AB.double().numpy(), expected_right, tol)
    close((left @ fm).AB.double().numpy(), left.double().numpy() @ dense(fm), tol)
    close((fm @ other).AB.double().numpy(), dense(fm) @ dense(other), tol)
    close((other_left @ fm).AB.double().numpy(), dense(other_left) @ dense(fm), tol)
    close((fm @ vector).double().numpy(), dense(fm) @ vector.double().numpy(), tol)
    close((row_vector @ fm).double().numpy(), row_vector.double().numpy() @ dense(fm), tol)
    close((c * fm).AB.double().numpy(), float(c) * dense(fm), tol)
    close((fm * c).AB.double().numpy(), float(c) * dense(fm), tol)
    assert (fm @ vector).shape == (*fm.batch_shape, fm.m)
    assert (row_vector @ fm).shape == (*fm.batch_shape, fm.n)
    assert (fm @ right).shape == expected_right.shape
    assert (fm @ right).r == min(fm.r, fm.n)
    assert (left @ fm).r == min(fm.r, fm.m)
    assert (fm @ other).r == min(fm.r, fm.n, 3)


def test_a_batch_times_a_vector_is_one_product_per_matrix():
    """The issue's example: no mixing of heads, whatever the inner dimension."""
    A, B = torch.randn(6, 2, 3, dtype=torch.float64), torch.randn(6, 3, 4, dtype=torch.float64)
    fm, u, v = FactoredMatrix(A, B), torch.randn(2, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
    torch.testing.assert_close(u @ fm, torch.stack([u @ A[i] @ B[i] for i in range(6)]))
    torch.testing.assert_close(fm @ v, torch.stack([A[i] @ B[i] @ v for i in range(6)]))
    square = FactoredMatrix(torch.randn(3, 3, 3), torch.randn(3, 3, 3))  # batch 3 and r 3: no accident
    torch.testing.assert_close(square @ torch.ones(3), square.AB @ torch.ones(3))


@pytest.mark.parametrize(
    "multiply",
    [
        lambda fm, x: fm @ x,
        lambda fm, x: x.mT @ fm,
        lambda fm, x: fm @ FactoredMatrix(x, torch.randn(3, 2)),
        lambda fm, x: FactoredMatrix(torch.randn(2, 3), x.mT) @ fm,
    ],
)
def test_leading_dimensions_that_do_not_broadcast_are_an_error(multiply):
    fm = FactoredMatrix(torch.randn(2, 3, 4), torch.randn(2, 4, 3))
    with pytest.raises(qkov.QkovError, match="do not broadcast"):
        multiply(fm, torch.randn(5, 3, 3))


def test_chain_keeps_the_smallest_inner_dimension_of_a_full_ov_circuit():
    """W_E W_V W_O W_U: the cut lands on d_head, never on d_model or the vocabulary."""
    W_E, W_V, W_O, W_U = torch.randn(50, 16), torch.randn(16, 4), torch.randn(4, 16), torch.randn(16, 50)
    ov = FactoredMatrix(W_E, W_V) @ FactoredMatrix(W_O, W_U)
    assert ov.r == 4 and ov.A.shape == (50, 4)
    torch.testing.assert_close(ov.AB, W_E @ W_V @ W_O @ W_U, rtol=1e-4, atol=1e-3)


@PROPERTY
@given(factored(), st.floats(-3, 3, allow_nan=False))
def test_scalar_multiplication(fm, c):
    close((c * fm).AB.double().numpy(), c * dense(fm), tolerance(fm) * 4)
    close((fm * c).AB.double().numpy(), c * dense(fm), tolerance(fm) * 4)
    close((-fm).AB.double().numpy(), -dense(fm), tolerance(fm))
    close((fm / 2).AB.double().numpy(), dense(fm) / 2, tolerance(fm))


@PROPERTY
@given(factored(), st.data())
def test_indexing_leading_dimensions_rows_and_columns(fm, data):
    key = []
    for size in fm.batch_shape:
        key.append(
            data.draw(
                st.one_of(
                    st.integers(0, size - 1),
                    st.just(slice(None)),
                    st.lists(st.integers(0, size - 1), min_size=1, max_size=1),
                )
            )
        )
    row = data.draw(
        st.one_of(
            st.integers(-fm.m, fm.m - 1),
            st.just(slice(None)),
            st.just(slice(0, None, 2)),
            st.lists(st.integers(0, fm.m - 1), min_size=1, max_size=4),
        )
    )
    col = data.draw(
        st.one_of(
            st.integers(-fm.n, fm.n - 1),
            st.just(slice(None)),
            st.lists(st.integers(0, fm.n - 1), min_size=1, max_size=4),
        )
    )
    full = (*key, row, col)
    expected = torch.from_numpy(dense(fm))[tuple(torch.tensor(k) if isinstance(k, list) else k for k in key)]
    expected = expected[..., torch.tensor(row) if isinstance(row, list) else row, :]
    expected = expected[..., torch.tensor(col) if isinstance(col, list) else col]
    picked = fm[tuple(torch.tensor(k) if isinstance(k, list) else k for k in full)]
    result = picked.AB if isinstance(picked, FactoredMatrix) else picked
    close(result.double().numpy(), expected.numpy(), tolerance(fm))


def test_indexing_one_head_and_an_ellipsis():
    A, B = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 4, 6)
    fm = FactoredMatrix(A, B)
    torch.testing.assert_close(fm[1, 2].AB, A[1, 2] @ B[1, 2])
    torch.testing.assert_close(fm[..., [0, 4], :].AB, (A @ B)[..., [0, 4], :])
    torch.testing.assert_close(fm[1, ..., 3], (A @ B)[1, ..., 3])
    torch.testing.assert_close(fm[:, 2, -1, :], (A @ B)[:, 2, -1, :])
    torch.testing.assert_close(fm[0, 1, 2, 3], (A @ B)[0, 1, 2, 3])
    with pytest.raises(qkov.QkovError, match="too many indices"):
        fm[0, 0, 0, 0, 0]


@PROPERTY
@given(factored(), st.integers(1, 5), st.booleans(), st.integers(1, 200))
def test_topk_over_all_entries_streams_to_the_same_answer(fm, k, largest, budget):
    k = min(k, fm.m * fm.n)
    result = fm.topk(k, largest=largest, memory_bytes=budget)  # tiny budgets: one row per block
    product = torch.from_numpy(dense(fm)).reshape(*fm.batch_shape, -1)
    expected = product.topk(k, dim=-1, largest=largest).values
    close(result.values.double().numpy(), expected.numpy(), tolerance(fm) * 10)
    found = torch.from_numpy(dense(fm)).reshape(-1, fm.m, fm.n)
    rows, cols = result.rows.reshape(-1, k), result.cols.reshape(-1, k)
    at = torch.stack([found[b, rows[b], cols[b]] for b in range(found.shape[0])]).reshape(result.values.shape)
    close(at.numpy(), result.values.double().numpy(), tolerance(fm) * 10)


@PROPERTY
@given(factored(), st.integers(1, 5), st.booleans())
def test_topk_per_row(fm, k, largest):
    k = min(k, fm.n)
    values, cols = fm.topk_per_row(k, largest=largest, memory_bytes=64)
    product = torch.from_numpy(dense(fm))
    close(
        values.double().numpy(), product.topk(k, dim=-1, largest=largest).values.numpy(), tolerance(fm) * 10
    )
    close(product.gather(-1, cols).numpy(), values.double().numpy(), tolerance(fm) * 10)


def test_topk_reads_factors_that_require_grad():
    """Model weights are parameters: reading their circuits must not trip over autograd."""
    A = torch.randn(6, 2, requires_grad=True)
    B = torch.randn(2, 5, requires_grad=True)
    fm = FactoredMatrix(A, B)
    torch.testing.assert_close(fm.topk(3).values, (A @ B).detach().flatten().topk(3).values)
    torch.testing.assert_close(fm.topk_per_row(2)[0], (A @ B).detach().topk(2, dim=-1).values)


def test_norm_of_ab_is_not_norm_of_ba():
    """The paper's trap (its published correction): tr and eigenvalues survive AB -> BA, the
    Frobenius norm does not. Here ||AB||_F = 2 and ||BA||_F = 0."""
    A = torch.tensor([[1.0], [1.0]], dtype=torch.float64)
    B = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    fm = FactoredMatrix(A, B)
    assert torch.linalg.matrix_norm(fm.BA) == 0.0
    assert fm.norm() == pytest.approx(2.0, rel=1e-15)
    assert fm.trace() == 0.0 and torch.all(fm.eigenvalues() == 0)


def test_eigenvalues_of_a_generic_product_match_dense():
    gen = torch.Generator().manual_seed(0)
    A = torch.randn(3, 20, 5, generator=gen, dtype=torch.float64)
    B = torch.randn(3, 5, 20, generator=gen, dtype=torch.float64)
    fm = FactoredMatrix(A, B)
    ours = fm.eigenvalues()
    dense_eigs = torch.linalg.eigvals(A @ B)
    for b in range(3):
        for value in ours[b]:
            assert (dense_eigs[b] - value).abs().min() < 1e-10 * float(fm.norm()[b])
        nonzero = dense_eigs[b][dense_eigs[b].abs() > 1e-8]
        assert len(nonzero) == 5


def test_broadcasting_of_leading_dimensions():
    A, B = torch.randn(3, 1, 4, 2), torch.randn(1, 5, 2, 6)
    fm = FactoredMatrix(A, B)
    assert fm.shape == (3, 5, 4, 6)
    torch.testing.assert_close(fm.AB, A @ B)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: FactoredMatrix(torch.randn(3, 2), torch.randn(3, 2)), "inner dimensions differ"),
        (lambda: FactoredMatrix(torch.randn(2, 3, 2), torch.randn(4, 2, 3)), "do not broadcast"),
        (lambda: FactoredMatrix(torch.randn(3, 2), torch.randn(2, 4)).eigenvalues(), "square"),
        (lambda: FactoredMatrix(torch.randn(3, 2), torch.randn(2, 4)).topk(13), "k must lie"),
        (lambda: FactoredMatrix(torch.randn(3, 2), torch.randn(2, 4)) @ torch.randn(3, 3), "cannot multiply"),
        (lambda: FactoredMatrix(torch.randn(3, 2), torch.randn(2, 4)) * torch.ones(2), "scalar only"),
    ],
)
def test_errors_are_clear(make, message):
    with pytest.raises(qkov.QkovError, match=message):
        make()


@st.composite
def shared(draw, square=False):
    """``L (A B) R`` in float64 with shared outer factors: any inner dimension (``r > m`` too, as
    ``d_head > d_vocab``), outer factors wider than tall or of rank one (rank-deficient ``L``),
    rank-deficient and zero inner factors, and ``R = L^T`` as a view (a full QK circuit)."""
    gen = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    m, d, r = draw(st.integers(1, 7)), draw(st.integers(1, 7)), draw(st.integers(1, 9))
    transposed = square and draw(st.booleans())
    e = d if transposed else draw(st.integers(1, 7))
    n = m if square else draw(st.integers(1, 7))
    batch_shape = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    A, B = gen.standard_normal((*batch_shape, d, r)), gen.standard_normal((*batch_shape, r, e))
    kind = draw(st.sampled_from(["generic", "repeated", "zero-columns", "zero"]))
    if kind == "repeated" and r > 1:
        A[..., :, 1:] = A[..., :, :1] * gen.standard_normal(r - 1)
    elif kind == "zero-columns":
        B[..., : r // 2, :] = 0.0
    elif kind == "zero":
        A[...] = 0.0
    L = gen.standard_normal((m, d))
    if draw(st.booleans()):  # rank one, taller than wide too: a singular Gram matrix L^T L
        L = L[:, :1] * gen.standard_normal(d)
    L = torch.tensor(L)
    R = L.mT if transposed else torch.tensor(gen.standard_normal((e, n)))
    return qkov.SharedFactoredMatrix(L, FactoredMatrix(torch.tensor(A), torch.tensor(B)), R)


def shared_dense(sfm):
    return sfm.left.numpy() @ sfm.inner.A.numpy() @ sfm.inner.B.numpy() @ sfm.right.numpy()


def shared_tolerance(sfm):
    """1e-10 of the scale ``||L|| ||A|| ||B|| ||R||``."""
    norms = [torch.linalg.matrix_norm(x).max() for x in (sfm.left, sfm.inner.A, sfm.inner.B, sfm.right)]
    return 1e-10 * max(float(np.prod(norms)), 1e-30)


@SHARED_PROPERTY
@given(shared())
def test_shared_factors_give_the_dense_norm_and_singular_values(sfm):
    product, tol = shared_dense(sfm), shared_tolerance(sfm)
    close(sfm.factored().AB.numpy(), product, tol)
    close(sfm.norm().numpy(), np.linalg.norm(product, axis=(-2, -1)), tol)
    S = sfm.singular_values().numpy()
    k = min(sfm.m, sfm.n, sfm.left.shape[1], sfm.right.shape[0], sfm.inner.r)
    assert S.shape == (*sfm.batch_shape, k)
    expected = np.linalg.svd(product, compute_uv=False)
    close(S, expected[..., :k], tol)
    close(expected[..., k:], np.zeros_like(expected[..., k:]), tol)  # nothing is left out


@SHARED_PROPERTY
@given(shared(square=True))
def test_shared_factors_give_the_dense_eigenvalues_and_trace(sfm):
    """Power sums of the eigenvalues (complex in general) are the traces of the dense powers."""
    product, tol = shared_dense(sfm), shared_tolerance(sfm)
    eigenvalues = sfm.eigenvalues().numpy()
    assert eigenvalues.shape[-1] == min(sfm.m, sfm.inner.r)
    close(sfm.trace().numpy(), np.trace(product, axis1=-2, axis2=-1), tol)
    scale = tol / 1e-10
    power = np.broadcast_to(np.eye(sfm.m), product.shape)
    for p in (1, 2, 3):
        power = power @ product
        close((eigenvalues**p).sum(-1), np.trace(power, axis1=-2, axis2=-1), 1e-9 * scale**p * sfm.m + 1e-300)


FLOAT32_TOLERANCE = 1e-5  # of the scale ||L|| ||A|| ||B|| ||R||; a float32 Gram would miss it (3e-4)


@SHARED_PROPERTY
@given(shared())
def test_float32_shared_factors_are_exact_to_float32_rounding(sfm):
    """The float32 path (a root of the Gram formed in float64, not a QR) against the dense float64
    product of the same float32 numbers: rank-deficient ``L`` and inner factors, ``r > m``, zeros."""
    sfm = sfm.to(torch.float32)
    product = shared_dense(sfm.to(torch.float64))
    tol = FLOAT32_TOLERANCE * shared_tolerance(sfm) / 1e-10
    close(sfm.norm().numpy(), np.linalg.norm(product, axis=(-2, -1)), tol)
    S = sfm.singular_values().numpy()
    k = min(sfm.m, sfm.n, sfm.left.shape[1], sfm.right.shape[0], sfm.inner.r)
    assert S.shape == (*sfm.batch_shape, k)
    close(S, np.linalg.svd(product, compute_uv=False)[..., :k], tol)


@settings(PROPERTY, max_examples=30)
@given(
    st.integers(1, 9),
    st.integers(1, 9),
    st.integers(1, 4),
    st.integers(1, 4),
    st.booleans(),
    st.integers(0, 2**31 - 1),
)
def test_roots_of_the_wide_gram_square_to_it(m, d, rows, leaf, transposed, seed):
    """``wide_gram`` (in row and recursive column blocks, of a matrix or a transposed view as
    ``W_U^T``) is ``X^T X`` in float64, and ``gram_root``'s ``R [min(m, d), d]`` squares back to it,
    positive definite (Cholesky) or not (eigenvalues)."""
    X = torch.tensor(np.random.default_rng(seed).standard_normal((m, d)), dtype=torch.float32)
    X = X.mT.contiguous().mT if transposed else X
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(linalg, "GRAM_ROWS", rows)
        patch.setattr(linalg, "GRAM_LEAF", leaf)
        gram = linalg.wide_gram(X)
    exact = X.double().mT @ X.double()
    assert gram.dtype == torch.float64
    close(gram.numpy(), exact.numpy(), 1e-13 * float(exact.abs().max()))
    root = linalg.gram_root(gram, min(m, d))
    assert root.shape == (min(m, d), d)
    close((root.mT @ root).numpy(), exact.numpy(), 1e-12 * float(exact.abs().max()))


def test_shared_factors_of_a_rotation_have_complex_eigenvalues():
    """A head that rotates token pairs: eigenvalues +-i, copying score 0."""
    Q = torch.linalg.qr(torch.randn(4, 4, dtype=torch.float64)).Q  # L A B R = Q (A B) Q^T: similar
    A = torch.tensor([[0.0, -1.0], [1.0, 0.0], [0.0, 0.0], [0.0, 0.0]], dtype=torch.float64)
    sfm = qkov.SharedFactoredMatrix(Q, FactoredMatrix(A, torch.eye(2, 4, dtype=torch.float64)), Q.mT)
    eigenvalues = sorted(sfm.eigenvalues().tolist(), key=lambda z: z.imag)
    assert eigenvalues == [pytest.approx(-1j, abs=1e-12), pytest.approx(1j, abs=1e-12)]
    assert float(qkov.copying_score(sfm)) == pytest.approx(0.0, abs=1e-12)


def test_shared_factors_index_heads_and_keep_one_qr_for_a_transposed_pair():
    L = torch.randn(30, 6, dtype=torch.float64)
    inner = FactoredMatrix(
        torch.randn(2, 3, 6, 4, dtype=torch.float64), torch.randn(2, 3, 4, 6, dtype=torch.float64)
    )
    sfm = qkov.SharedFactoredMatrix(L, inner, L.mT)
    assert (
        sfm._right_is_left_transposed
        and not qkov.SharedFactoredMatrix(L, inner, L.mT.clone())._right_is_left_transposed
    )
    one = sfm[1, 2]
    assert one.shape == (30, 30)
    torch.testing.assert_close(one.factored().AB, L @ inner.A[1, 2] @ inner.B[1, 2] @ L.mT)
    torch.testing.assert_close(sfm.norm()[1, 2], one.norm())
    with pytest.raises(qkov.QkovError, match="indexed by head only"):
        sfm[0, 0, 0]
    with pytest.raises(qkov.QkovError, match="cannot multiply"):
        qkov.SharedFactoredMatrix(torch.randn(30, 5), inner, L.mT)


@SHARED_PROPERTY
@given(shared(square=True), st.integers(1, 4))
def test_float64_eigenvalues_of_float32_factors_widen_rows_at_a_time(sfm, rows):
    """``eigenvalues(torch.float64)`` of float32 factors forms ``R L`` in float64, ``rows`` of the
    outer factors widened at a time: the eigenvalues of the whole float64 copy, to its rounding."""
    single = sfm.to(torch.float32)
    widened = single.to(torch.float64)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(linalg, "GRAM_ROWS", rows)
        got = single.eigenvalues(torch.float64)
    expected = widened.eigenvalues()
    assert got.dtype == torch.complex128
    scale = float(widened.inner.B.abs().max() * widened.inner.A.abs().max()) * float(
        (widened.right.abs() @ widened.left.abs()).max()
    )
    for p in (1, 2):  # power sums: the eigenvalues' order is not defined
        close((got**p).sum(-1).numpy(), (expected**p).sum(-1).numpy(), 1e-12 * max(scale, 1e-30) ** p * sfm.m)


def test_layers_share_the_outer_roots_and_give_the_whole_batchs_numbers():
    """A pass over layers (:meth:`share_outer`) gives each layer the numbers of the whole batch,
    computing the roots of the shared factors once; factors that are not the same are refused."""
    L, R = torch.randn(40, 6, dtype=torch.float64), torch.randn(6, 40, dtype=torch.float64)
    inner = FactoredMatrix(
        torch.randn(3, 2, 6, 4, dtype=torch.float64), torch.randn(3, 2, 4, 6, dtype=torch.float64)
    )
    whole = qkov.SharedFactoredMatrix(L, inner, R)
    first = None
    for layer in range(3):
        one = qkov.SharedFactoredMatrix(
            L, FactoredMatrix(inner.A[layer : layer + 1], inner.B[layer : layer + 1]), R
        )
        first = one if first is None else first
        one.share_outer(first)
        torch.testing.assert_close(one.singular_values()[0], whole.singular_values()[layer])
        torch.testing.assert_close(one.eigenvalues()[0], whole.eigenvalues()[layer])
        assert one._outer is first._outer
    assert len(first._outer) == 3  # the left root, the right root and R L: once for all layers
    with pytest.raises(qkov.QkovError, match="same outer factors"):
        qkov.SharedFactoredMatrix(L.clone(), inner, R).share_outer(whole)


def test_float64_gram_is_remembered_while_its_tensor_lives_unchanged():
    """The float64 Gram of a live tensor is computed once (a transposed view of it too); changed in
    place, or gone (its memory free for another tensor), it is computed again."""
    W = torch.randn(50, 6)
    first = linalg.float64_gram(W)
    torch.testing.assert_close(first, W.double().mT @ W.double(), rtol=1e-12, atol=1e-12)
    assert linalg.float64_gram(W) is first
    assert linalg.float64_gram(W.mT.mT) is first  # a view of it, read the same way
    transposed = linalg.float64_gram(W.mT)
    torch.testing.assert_close(transposed, W.double() @ W.double().mT, rtol=1e-12, atol=1e-12)
    W.mul_(2)  # in place: its version moves
    torch.testing.assert_close(linalg.float64_gram(W), 4 * first, rtol=1e-12, atol=1e-12)
    shape = W.shape
    del W
    other = torch.full(shape, 3.0)  # may reuse the freed memory: never the old Gram
    torch.testing.assert_close(linalg.float64_gram(other), torch.full((6, 6), 450.0, dtype=torch.float64))


def tall(X: torch.Tensor) -> TallMatrix:
    """``X [m, d]`` as a :class:`~qkov.tall.TallMatrix` whose rows are read from a copy of it, block
    by block (where a narrow lazy model's reader converts and folds its stored rows)."""
    rows = X.clone()
    return TallMatrix(lambda start, stop: rows[start:stop], tuple(X.shape), X.dtype, X.device)


@SHARED_PROPERTY
@given(shared(), st.integers(1, 4))
def test_tall_outer_factors_give_what_whole_ones_give(sfm, rows):
    """Outer factors read ``rows`` rows at a time (:class:`~qkov.tall.TallMatrix`) give the float32
    path's norm, singular values, eigenvalues, trace and factors, to float32 rounding; one tall
    factor and its ``.mT`` (a full QK circuit) share one root."""
    single = sfm.to(torch.float32)
    left = tall(single.left)
    right = left.mT if single._right_is_left_transposed else tall(single.right.mT).mT
    streamed = qkov.SharedFactoredMatrix(left, single.inner, right)
    assert streamed._right_is_left_transposed == single._right_is_left_transposed
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(linalg, "GRAM_ROWS", rows)
        got = [streamed.norm(), streamed.singular_values(), streamed.factored().AB]
        expected = [single.norm(), single.singular_values(), single.factored().AB]
        if sfm.m == sfm.n:
            got += [streamed.trace(), (streamed.eigenvalues(torch.float64) ** 2).sum(-1)]
            expected += [single.trace(), (single.eigenvalues(torch.float64) ** 2).sum(-1)]
    scale = shared_tolerance(sfm) / 1e-10
    for a, b in zip(got, expected, strict=True):  # the squared eigenvalues' sum: of the scale squared
        close(a.numpy(), b.numpy(), FLOAT32_TOLERANCE * scale ** (2 if a.dtype == torch.complex128 else 1))


def test_tall_matrix_is_read_by_blocks_of_its_long_dimension_only():
    X = tall(torch.arange(12.0).reshape(6, 2))
    assert X.shape == (6, 2) and X.mT.shape == (2, 6) and X.mT.mT.same_as(X)
    torch.testing.assert_close(X[1:3], torch.tensor([[2.0, 3.0], [4.0, 5.0]]))
    torch.testing.assert_close(X.mT[:, 4:], torch.tensor([[8.0, 10.0], [9.0, 11.0]]))
    for key in ((slice(None), slice(0, 2)), 3, slice(0, 4, 2)):
        with pytest.raises(qkov.QkovError, match="read by blocks of its long dimension only"):
            X[key]
    with pytest.raises(qkov.QkovError, match="read by blocks"):
        X.mT[0:2]
    assert X.to(torch.float32) is X and X.to(torch.float64)[0:1].dtype == torch.float64
