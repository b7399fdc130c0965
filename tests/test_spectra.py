"""Every head's full OV and QK spectra from shared factors, against dense float64 circuits, on
hand-built heads with known spectra, and against FactoredMatrix at a larger float32 shape."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qkov
from qkov.circuits.spectra import effective_rank

from conftest import random_model, small_float64_models
from handbuilt import skip_trigram_model

PROPERTY = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def dense_circuit(model, circuit):
    full = qkov.full_ov_circuit(model) if circuit == "OV" else qkov.full_qk_circuit(model)
    return full.AB.detach().numpy()


def factor_norms(model, circuit):
    """``|A|_2 |B|_2`` of each head's circuit ``A B``: the scale of the dense product's rounding."""
    full = qkov.full_ov_circuit(model) if circuit == "OV" else qkov.full_qk_circuit(model)
    a, b = (torch.linalg.matrix_norm(x.detach(), ord=2) for x in (full.A, full.B))
    return (a * b).numpy()


@PROPERTY
@given(small_float64_models(), st.integers(1, 12), st.sampled_from(["OV", "QK"]))
def test_spectra_match_the_dense_circuits(model, k, circuit):
    dense, factor_scale = dense_circuit(model, circuit), factor_norms(model, circuit)
    rows = qkov.head_spectra(model, circuit, k=k)
    copying = {h.name: h.copying_score for h in qkov.copying_analysis(model, baseline_samples=2).heads}
    assert [row.name for row in rows] == [f"L{layer}H{head}" for layer, head in np.ndindex(dense.shape[:2])]
    for row in rows:
        M = dense[row.layer, row.head]
        S = np.linalg.svd(M, compute_uv=False)
        tol = 1e-10 * max(S[0], 1e-300)
        assert row.norm == pytest.approx(np.linalg.norm(M), abs=tol)
        # the rank's tolerance (numpy's, eps * max(m, n) * s_max) decides which values are kept; a value
        # within a factor of 2 of it may fall either way, computed densely or from the cores. The dense
        # product itself cannot resolve values under its rounding, eps * max(m, n) * |A| |B| (spectral
        # norms of its factors), which is far above s_max's when the factors cancel: a rank-1 circuit
        # of s_max 4e-4 once had a dense second singular value of 3e-18, noise, that the cores drop.
        eps = np.finfo(np.float64).eps
        rank_tol = eps * max(M.shape) * S[0]
        floor = eps * max(M.shape) * factor_scale[row.layer, row.head]
        kept = len(row.singular_values)
        at_least, at_most = (int((S > t).sum()) for t in (2 * max(rank_tol, floor), rank_tol / 2))
        assert min(k, at_least) <= kept <= min(k, at_most)
        np.testing.assert_allclose(row.singular_values, S[:kept], rtol=0, atol=tol)
        p = S**2 / max((S**2).sum(), 1e-300)
        entropy = -sum(x * math.log(x) for x in p if x > 0)
        assert row.effective_rank == pytest.approx(math.exp(entropy) if S[0] > 0 else 0.0, rel=1e-10)
        if circuit == "OV":  # the copying score, computed once, by copying_analysis
            eigenvalues = np.linalg.eigvals(M)
            total = np.abs(eigenvalues).sum()
            score = eigenvalues.real.sum() / total if total > 1e-12 * max(S[0], 1e-300) else 0.0
            assert copying[row.name] == pytest.approx(score, abs=1e-9)


def test_hand_built_heads_have_their_planted_spectra():
    """Head 0 maps token 5 to 9 with weight 5 (rank 1), head 1 is +I, head 2 is -I (16 tokens);
    their QK circuits: head 0's attention is rank one, heads 1 and 2 attend uniformly (zero)."""
    model = skip_trigram_model([(5, 3, 9)])
    planted, copy, anti = qkov.head_spectra(model, "OV", k=20)
    assert planted.singular_values == pytest.approx((5.0,)) and planted.effective_rank == pytest.approx(1.0)
    assert copy.singular_values == pytest.approx((1.0,) * 16) and copy.effective_rank == pytest.approx(16.0)
    assert anti.singular_values == pytest.approx((1.0,) * 16) and copy.norm == pytest.approx(4.0)
    qk = qkov.head_spectra(model, "QK", k=3)
    assert qk[0].singular_values == pytest.approx((64.0 / 4,))
    assert qk[1].singular_values == () and qk[1].effective_rank == 0.0 and qk[1].norm == 0.0


def test_effective_rank_of_known_spectra():
    S = torch.tensor([[3.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    assert effective_rank(S).tolist() == pytest.approx([1.0, 3.0, 0.0])


def test_spectra_agree_with_factored_matrix_at_a_larger_float32_shape():
    """2000 tokens, d_model 96, d_head 24, float32: the shared-factor spectra against the
    vocabulary-long factors of FactoredMatrix, to float32 precision."""
    cfg = qkov.Config(
        n_layers=2, n_heads=3, d_model=96, d_head=24, d_vocab=2000, n_ctx=4, positional_embedding="none"
    )
    model = random_model(cfg, seed=4)
    for circuit, full in (("OV", qkov.full_ov_circuit(model)), ("QK", qkov.full_qk_circuit(model))):
        rows = qkov.head_spectra(model, circuit, k=10)
        with torch.no_grad():
            norms, S = full.norm(), full.svd()[1]
        for row in rows:
            assert row.norm == pytest.approx(float(norms[row.layer, row.head]), rel=1e-5)
            np.testing.assert_allclose(row.singular_values, S[row.layer, row.head, :10].numpy(), rtol=1e-4)


@pytest.mark.parametrize(
    ("kwargs", "message"), [({"circuit": "VO"}, "'OV' or 'QK'"), ({"k": 0}, "at least 1")]
)
def test_bad_arguments_are_clear(kwargs, message):
    with pytest.raises(qkov.QkovError, match=message):
        qkov.head_spectra(skip_trigram_model([]), **kwargs)
