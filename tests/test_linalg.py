"""FactoredMatrix against dense float64 products: hypothesis property tests for every operation,
and hand-built matrices with known answers (section "Summarizing OV/QK Matrices")."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qkov
from qkov import FactoredMatrix, copying_score, random_copying_scores

PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


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
    fm = fm.to(torch.float64)
    assert fm.rank.numpy().tolist() == np.linalg.matrix_rank(dense(fm)).tolist()


@PROPERTY
@given(factored(batch=False), st.integers(1, 6), st.integers(0, 2**31 - 1))
def test_matmul_with_tensors_and_factored_matrices(fm, k, seed):
    gen = torch.Generator().manual_seed(seed)
    right = torch.randn(fm.n, k, generator=gen, dtype=fm.dtype)
    left = torch.randn(k, fm.m, generator=gen, dtype=fm.dtype)
    other = FactoredMatrix(
        torch.randn(fm.n, 3, generator=gen, dtype=fm.dtype), torch.randn(3, k, generator=gen, dtype=fm.dtype)
    )
    vector = torch.randn(fm.n, generator=gen, dtype=fm.dtype)
    row_vector = torch.randn(fm.m, generator=gen, dtype=fm.dtype)
    tol = tolerance(fm) * 100
    close((fm @ right).AB.double().numpy(), dense(fm) @ right.double().numpy(), tol)
    close((left @ fm).AB.double().numpy(), left.double().numpy() @ dense(fm), tol)
    close((fm @ other).AB.double().numpy(), dense(fm) @ dense(other), tol)
    close((fm @ vector).double().numpy(), dense(fm) @ vector.double().numpy(), tol)
    close((row_vector @ fm).double().numpy(), row_vector.double().numpy() @ dense(fm), tol)
    assert (fm @ right).r == min(fm.r, fm.n)
    assert (left @ fm).r == min(fm.r, fm.m)
    assert (fm @ other).r == min(fm.r, fm.n, 3)


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


def test_copying_score_of_known_matrices():
    eye = torch.eye(4, dtype=torch.float64)
    rotation = torch.tensor([[0.0, -1.0], [1.0, 0.0]], dtype=torch.float64)
    assert copying_score(FactoredMatrix(eye, eye)) == 1.0
    assert copying_score(FactoredMatrix(-eye, eye)) == -1.0
    assert copying_score(FactoredMatrix(torch.zeros(4, 2), torch.zeros(2, 4))) == 0.0
    assert copying_score(FactoredMatrix(rotation, torch.eye(2, dtype=torch.float64))).abs() < 1e-15
    # diag(3, -1): (3 - 1) / (3 + 1)
    diag = torch.diag(torch.tensor([3.0, -1.0], dtype=torch.float64))
    assert copying_score(FactoredMatrix(diag, torch.eye(2, dtype=torch.float64))) == pytest.approx(0.5)
    # Batched: one score per matrix.
    both = FactoredMatrix(torch.stack([eye, -eye]), eye)
    assert copying_score(both).tolist() == [1.0, -1.0]


def test_random_baseline_is_centred_and_bounded():
    fm = FactoredMatrix(torch.randn(30, 4), torch.randn(4, 30))
    scores = random_copying_scores(fm, n_samples=200, generator=torch.Generator().manual_seed(0))
    assert scores.shape == (200,)
    assert torch.all(scores.abs() <= 1.0)
    assert abs(float(scores.mean())) < 0.1  # E[tr(AB)] = 0 for independent Gaussian factors
    assert float(scores.std()) > 0.05


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
