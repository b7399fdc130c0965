"""Copying: the eigenvalue statistic and its baseline, the direct measures against dense float64
full OV circuits, the sampled estimate's interval, and the comparison on hand-built heads whose
answers are known (section "Copying / Primarily Positive Eigenvalues")."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qkov
from qkov import FactoredMatrix, copying_score, random_copying_scores
from qkov.circuits import copying

from conftest import random_model, small_float64_models
from handbuilt import skip_trigram_model

PROPERTY = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def ov_model(ovs: list[torch.Tensor]) -> qkov.AttnOnlyTransformer:
    """One layer, ``W_E = W_U = I``: head ``h``'s full OV circuit is exactly ``ovs[h]``."""
    V = ovs[0].shape[0]
    cfg = qkov.Config(
        n_layers=1, n_heads=len(ovs), d_model=V, d_head=V, d_vocab=V, n_ctx=4, positional_embedding="none"
    )
    model = random_model(cfg).double()
    with torch.no_grad():
        model.W_E.copy_(torch.eye(V))
        model.W_U.copy_(torch.eye(V))
        for h, ov in enumerate(ovs):
            model.blocks[0].attn.W_V[h] = ov
            model.blocks[0].attn.W_O[h] = torch.eye(V)
    return model


def dense_direct(model) -> dict[str, dict]:
    """The direct measures from each head's dense float64 full OV circuit."""
    full = qkov.full_ov_circuit(model).AB.detach().double().numpy()
    out = {}
    for layer, head in np.ndindex(full.shape[:2]):
        M = full[layer, head]
        diagonal = np.diagonal(M)
        std = M.std(1)
        z = np.where(std > 0, (diagonal - M.mean(1)) / np.where(std > 0, std, 1), 0.0)
        rank = (M >= diagonal[:, None]).sum(1)
        out[f"L{layer}H{head}"] = {"diagonal": diagonal, "z": z, "rank": rank, "M": M}
    return out


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


@PROPERTY
@given(small_float64_models(), st.integers(1, 4096))
def test_direct_measures_match_the_dense_circuit(model, block_bytes):
    expected = dense_direct(model)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(copying, "BLOCK_BYTES", block_bytes)  # streamed in blocks of any size
        rows = qkov.direct_copying(model, progress=False)
    for row in rows:
        e = expected[row.name]
        scale = max(np.abs(e["M"]).max(), 1e-30)
        assert row.diagonal_mean == pytest.approx(e["diagonal"].mean(), abs=1e-10 * scale)
        assert row.diagonal_z == pytest.approx(e["z"].mean(), abs=1e-8)
        assert row.self_rank_median == np.median(e["rank"])
        assert row.self_top1 == np.mean(e["rank"] == 1)
        assert row.exact and row.self_top1_ci is None and row.rows == model.cfg.d_vocab


def test_a_copying_head_ranks_itself_first_and_an_anti_copying_head_last():
    model = skip_trigram_model([(5, 3, 9)])
    V = model.cfg.d_vocab
    rows = {row.name: row for row in qkov.direct_copying(model, progress=False)}
    copy, anti, planted = rows["L0H1"], rows["L0H2"], rows["L0H0"]
    assert copy.self_rank_median == 1 and copy.self_top1 == 1.0
    assert copy.diagonal_mean == 1.0 and copy.diagonal_z == pytest.approx(math.sqrt(V - 1), rel=1e-6)
    assert anti.self_rank_median == V and anti.self_top1 == 0.0
    assert anti.diagonal_z == pytest.approx(-math.sqrt(V - 1), rel=1e-6)
    assert planted.self_top1 == 0.0 and planted.diagonal_mean == 0.0  # zero rows tie: not a copy


def partly_copying_model() -> qkov.AttnOnlyTransformer:
    """W_U = W_E^T and OV = I + noise over 300 tokens in 16 dimensions: a token raises itself most
    only sometimes (self_top1 between 0.1 and 0.9 in every head)."""
    cfg = qkov.Config(
        n_layers=1, n_heads=3, d_model=16, d_head=16, d_vocab=300, n_ctx=4, positional_embedding="none"
    )
    model = random_model(cfg, seed=1).double()
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        model.W_U.copy_(model.W_E.mT)
        for h, noise in enumerate((0.1, 0.2, 0.3)):
            model.blocks[0].attn.W_V[h] = torch.eye(16) + noise * torch.randn(16, 16, generator=gen)
            model.blocks[0].attn.W_O[h] = torch.eye(16)
    return model


def test_the_sampled_estimate_scores_its_rows_exactly_and_its_interval_holds_the_exact_value():
    model = partly_copying_model()
    exact = {row.name: row for row in qkov.direct_copying(model, progress=False)}
    sampled = qkov.direct_copying(
        model, sample_rows=60, generator=torch.Generator().manual_seed(3), progress=False
    )
    picked = torch.randperm(300, generator=torch.Generator().manual_seed(3))[:60].numpy()
    expected = dense_direct(model)
    for row in sampled:
        truth = exact[row.name]
        assert 0.1 < truth.self_top1 < 0.9
        assert row.rows == 60 and not row.exact
        assert row.self_top1 == np.mean(expected[row.name]["rank"][picked] == 1)
        low, high = row.self_top1_ci
        assert low <= truth.self_top1 <= high
        assert row.diagonal_z == truth.diagonal_z  # always over every token
    whole = qkov.direct_copying(model, sample_rows=1000, progress=False)  # more rows than tokens
    assert all(row.exact and row.rows == 300 for row in whole)
    with pytest.raises(qkov.QkovError, match="sample_rows"):
        qkov.direct_copying(model, sample_rows=0, progress=False)


def test_wilson_interval_of_known_counts():
    """Values from the closed form (Wilson 1927), and the exact ends at 0 and n successes."""
    low, high = copying.wilson_interval(5, 10)
    assert low == pytest.approx(0.2366, abs=1e-4) and high == pytest.approx(0.7634, abs=1e-4)
    assert copying.wilson_interval(0, 20)[0] == 0.0 and copying.wilson_interval(20, 20)[1] == 1.0
    assert copying.wilson_interval(0, 20)[1] == pytest.approx(0.1611, abs=1e-4)


def test_positive_eigenvalues_without_copying_are_a_disagreement():
    """``I + 10 N`` (N the shift): every eigenvalue is 1 (score 1), yet each token raises the next
    token ten times more than itself. ``I`` and ``-I`` agree (copying / not copying)."""
    V = 8
    shear = torch.eye(V) + 10 * torch.diag(torch.ones(V - 1), 1)
    model = ov_model([shear, torch.eye(V), -torch.eye(V)])
    scores, direct = qkov.copying_analysis(model), qkov.direct_copying(model, progress=False)
    rows = qkov.compare_copying(scores, direct)
    verdicts = {r.name: (r.eigenvalues_say_copying, r.direct_says_copying, r.disagree) for r in rows}
    assert verdicts == {
        "L0H0": (True, False, True),
        "L0H1": (True, True, False),
        "L0H2": (False, False, False),
    }
    assert scores.heads[0].copying_score == pytest.approx(1.0) and direct[0].self_top1 == pytest.approx(1 / V)
    with pytest.raises(qkov.QkovError, match="different heads"):
        qkov.compare_copying(scores, direct[:2])


def test_the_budget_is_exact_for_small_models_and_samples_wide_vocabularies():
    """Within the budget nothing is sampled; GPT-2 small samples both (its pass over every token's
    diagonal alone is 1.4 TFLOP); the paper's one-layer shape keeps its diagonal exact and samples
    ranked rows; Llama-3.2-1B's shape gets the least of each. Every plan fits its budget, but for
    those least numbers."""
    small = qkov.Config(n_layers=2, n_heads=4, d_model=128, d_head=32, d_vocab=4096, n_ctx=128)
    gpt2 = qkov.Config(n_layers=12, n_heads=12, d_model=768, d_head=64, d_vocab=50257, n_ctx=1024)
    one_layer = qkov.Config(n_layers=1, n_heads=12, d_model=768, d_head=64, d_vocab=50257, n_ctx=1024)
    llama = qkov.Config(n_layers=16, n_heads=32, d_model=2048, d_head=64, d_vocab=128256, n_ctx=1024)
    budget = copying.EXACT_FLOP_BUDGET["cpu"]
    assert copying.sample_rows_for(small) == (None, None)
    diagonal, ranks = copying.sample_rows_for(gpt2)
    assert copying.MIN_DIAGONAL_ROWS < diagonal < 50257 and copying.MIN_RANK_ROWS < ranks < 64
    assert diagonal * 4 * 144 * 64 * 768 <= budget / 2 and ranks * 2 * 144 * 768 * 50257 <= budget / 2
    assert copying.sample_rows_for(gpt2, "cuda") == (None, None)
    diagonal, ranks = copying.sample_rows_for(one_layer)
    assert diagonal is None and 1000 < ranks < 50257
    assert 50257 * 4 * 12 * 64 * 768 + ranks * 2 * 12 * 64 * 50257 <= budget
    assert copying.sample_rows_for(llama) == (copying.MIN_DIAGONAL_ROWS, copying.MIN_RANK_ROWS)


@PROPERTY
@given(small_float64_models(), st.integers(1, 64), st.integers(1, 64), st.integers(0, 2**16))
def test_sampled_diagonals_and_ranks_match_the_dense_circuit_on_the_drawn_tokens(model, rows, tokens, seed):
    """Both samples come from one draw: the diagonal's tokens and the ranked rows are its first
    ``tokens`` and ``rows``, each value exact, and the standard errors are the sample's, corrected
    for drawing without replacement. The ranks are read in either of their two forms."""
    V = model.cfg.d_vocab
    got = qkov.direct_copying(
        model, rows, generator=torch.Generator().manual_seed(seed), progress=False, diagonal_rows=tokens
    )
    drawn = torch.randperm(V, generator=torch.Generator().manual_seed(seed)).numpy()
    ranked, averaged = np.sort(drawn[:rows]), drawn[:tokens]
    for row in got:
        e = dense_direct(model)[row.name]
        scale = max(np.abs(e["M"]).max(), 1e-30)
        assert row.exact == (rows >= V) and row.rows == min(rows, V)
        assert row.self_rank_median == np.median(e["rank"][ranked])
        if tokens >= V:
            assert row.diagonal_rows is None and row.diagonal_z_se is None and row.diagonal_mean_se is None
            continue
        n = len(averaged)
        correction = (1 - n / V) / n
        for value, se, dense, tolerance in (
            (row.diagonal_mean, row.diagonal_mean_se, e["diagonal"][averaged], 1e-10 * scale),
            (row.diagonal_z, row.diagonal_z_se, e["z"][averaged], 1e-8),
        ):
            assert value == pytest.approx(dense.mean(), abs=tolerance)
            spread = dense.var(ddof=1) if n > 1 else 0.0
            assert se == pytest.approx(math.sqrt(spread * correction), abs=10 * tolerance)
        assert row.diagonal_rows == n


def test_a_sampled_diagonal_is_within_its_standard_errors_of_the_whole_one():
    """Over 200 of 300 tokens, every head's mean diagonal z lies within 3 standard errors of the
    mean over every token; so does the mean diagonal."""
    model = partly_copying_model()
    exact = {row.name: row for row in qkov.direct_copying(model, progress=False)}
    gen = torch.Generator().manual_seed(5)
    sampled = qkov.direct_copying(model, 20, generator=gen, progress=False, diagonal_rows=200)
    for row in sampled:
        truth = exact[row.name]
        assert row.diagonal_rows == 200 and 0 < row.diagonal_z_se
        assert abs(row.diagonal_z - truth.diagonal_z) <= 3 * row.diagonal_z_se
        assert abs(row.diagonal_mean - truth.diagonal_mean) <= 3 * row.diagonal_mean_se
    with pytest.raises(qkov.QkovError, match="diagonal_rows"):
        qkov.direct_copying(model, diagonal_rows=0, progress=False)


def test_copying_and_anti_copying_heads():
    model = skip_trigram_model([(5, 3, 9)])
    analysis = copying.copying_analysis(model)
    assert [h.copying_score for h in analysis.heads] == pytest.approx([0.0, 1.0, -1.0], abs=1e-9)
    assert [h.copies for h in analysis.heads] == [False, True, False] and analysis.copying_heads == 1
    assert [h.name for h in analysis.heads] == ["L0H0", "L0H1", "L0H2"]
    assert analysis.threshold == pytest.approx(
        float(torch.tensor(analysis.baseline).quantile(0.99)), abs=1e-4
    )
    direct = copying.direct_copying(model, progress=False)
    assert direct[1].self_top1 == 1.0 and direct[2].self_top1 == 0.0
    assert direct[1].diagonal_z > 3 and direct[2].diagonal_z < -3


def _ks_statistic(x: torch.Tensor, y: torch.Tensor) -> float:
    """The two-sample Kolmogorov-Smirnov statistic: the largest gap between the empirical CDFs."""
    grid = torch.cat([x, y]).sort().values
    cdf = [torch.searchsorted(s.sort().values, grid, right=True) / len(s) for s in (x, y)]
    return float((cdf[0] - cdf[1]).abs().max())


@pytest.mark.parametrize("m, r", [(40, 4), (300, 16)])
def test_the_baseline_drawn_from_the_law_of_BA_matches_the_factors(m, r, monkeypatch):
    """Above FACTOR_DRAW_ENTRIES the baseline draws B A from its law (Bartlett); both ways must give
    the same distribution of copying scores (two-sample KS at the 0.1% level, seeded) and of B A."""
    fm = FactoredMatrix(torch.zeros(m, r, dtype=torch.float64), torch.zeros(r, m, dtype=torch.float64))
    n = 2000
    factors = random_copying_scores(fm, n, torch.Generator().manual_seed(0))
    monkeypatch.setattr(copying, "FACTOR_DRAW_ENTRIES", 0)
    law = random_copying_scores(fm, n, torch.Generator().manual_seed(1))
    assert _ks_statistic(factors, law) < 1.949 * (2 / n) ** 0.5
    small = copying._reordered_gaussian_products(m, r, n, torch.Generator().manual_seed(2))
    assert float(small.square().mean()) == pytest.approx(m, rel=0.03)  # E[(B A)_ij^2] = m
    assert abs(float(small.mean())) < 0.05 * m**0.5


def test_a_large_baseline_draws_from_the_law_and_stays_seeded():
    fm = FactoredMatrix(torch.zeros(2**16, 32), torch.zeros(32, 2**16))  # 2M entries per factor
    first = random_copying_scores(fm, 50, torch.Generator().manual_seed(0))
    again = random_copying_scores(fm, 50, torch.Generator().manual_seed(0))
    assert torch.equal(first, again) and first.shape == (50,)
    assert float(first.abs().max()) < 0.5  # random heads: far from copying
