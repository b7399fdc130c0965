"""Composition scores against the paper's formulas computed densely in float64 (column-vector
form, as printed), against TransformerLens, and the token-level K-composition term."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

import qkov
from qkov.circuits.composition import random_composition_scores
from qkov.circuits.heads import induction_scores
from qkov.interop.fold import circuit_model
from qkov.linalg import FactoredMatrix

from conftest import random_model
from handbuilt import pointer_arithmetic_model


def model_3x4(seed=0, **kw):
    cfg = qkov.Config(**(dict(n_layers=3, n_heads=4, d_model=24, d_head=5, d_vocab=31, n_ctx=8) | kw))
    return random_model(cfg, seed=seed).double()


def paper_forms(model, layer, head):
    """The paper's column-vector W_QK = W_Q^T W_K and W_OV = W_O W_V, with the paper's shapes
    (W_Q, W_K, W_V: [d_head, d_model]; W_O: [d_model, d_head])."""
    attn = model.blocks[layer].attn
    W_Q, W_K, W_V = (getattr(attn, n)[head].detach().T for n in ("W_Q", "W_K", "W_V"))
    W_O = attn.W_O[head].detach().T
    return W_Q.T @ W_K, W_O @ W_V


def dense_score(kind, model, writer, reader):
    _, ov1 = paper_forms(model, *writer)
    qk2, ov2 = paper_forms(model, *reader)
    fro = torch.linalg.matrix_norm
    if kind == "Q":
        return fro(qk2.T @ ov1) / (fro(qk2) * fro(ov1))
    if kind == "K":
        return fro(qk2 @ ov1) / (fro(qk2) * fro(ov1))
    return fro(ov2 @ ov1) / (fro(ov2) * fro(ov1))


@pytest.mark.parametrize("kind", ["Q", "K", "V"])
def test_raw_scores_match_the_papers_formulas_densely(kind):
    model = model_3x4()
    scores = qkov.composition_scores(model, kind, subtract_baseline=False)
    assert scores.shape == (3, 4, 3, 4)
    for l1, h1, l2, h2 in itertools.product(range(3), range(4), range(3), range(4)):
        if l1 >= l2:
            assert math.isnan(scores[l1, h1, l2, h2])
        else:
            expected = dense_score(kind, model, (l1, h1), (l2, h2))
            assert float(scores[l1, h1, l2, h2]) == pytest.approx(float(expected), rel=1e-10)


def test_the_kinds_differ_on_a_random_model():
    model = model_3x4()
    q, k, v = (qkov.composition_scores(model, kind, subtract_baseline=False) for kind in "QKV")
    assert not torch.allclose(q.nan_to_num(), k.nan_to_num())
    assert not torch.allclose(k.nan_to_num(), v.nan_to_num())


@pytest.mark.parametrize("kind", ["Q", "K", "V"])
def test_raw_scores_match_transformer_lens(kind):
    pytest.importorskip("transformer_lens")
    model = model_3x4(seed=2, d_vocab=17)
    tl = qkov.interop.to_hooked_transformer(model)
    theirs = tl.all_composition_scores(kind).double()
    ours = qkov.composition_scores(model, kind, subtract_baseline=False)
    valid = ~ours.isnan()
    torch.testing.assert_close(ours[valid], theirs[valid], rtol=1e-5, atol=1e-7)


def test_the_baseline_is_deterministic_and_centres_random_models_on_zero():
    first = qkov.composition_baseline(24, 5)
    random_composition_scores.cache_clear()
    assert qkov.composition_baseline(24, 5) == first
    assert 0 < first < 1
    # Gaussian heads compose at chance: the baseline-subtracted scores average about zero
    cfg = qkov.Config(n_layers=4, n_heads=8, d_model=24, d_head=5, d_vocab=7, n_ctx=4)
    scores = torch.cat(
        [
            qkov.composition_scores(random_model(cfg, seed=s), kind).flatten()
            for s in range(3)
            for kind in "QKV"
        ]
    )
    scores = scores[~scores.isnan()]
    assert abs(float(scores.mean())) < 0.1 * first
    raw = qkov.composition_scores(random_model(cfg), "K", subtract_baseline=False)
    torch.testing.assert_close(qkov.composition_scores(random_model(cfg), "K"), raw - first, equal_nan=True)


def test_an_unknown_kind_is_a_clear_error():
    with pytest.raises(qkov.QkovError, match="one of Q, K, V"):
        qkov.composition_scores(model_3x4(), "O")


def test_a_head_that_writes_where_another_reads_composes_fully():
    """L0H0 writes only into a subspace that L1H0's keys read: K-composition is 1, Q is not."""
    model = model_3x4(n_layers=2)
    with torch.no_grad():
        b0, b1 = model.blocks[0].attn, model.blocks[1].attn
        b0.W_O[0].zero_()
        b0.W_O[0][:, :5] = torch.eye(5, dtype=torch.float64)  # writes into residual dims 0..4
        b1.W_K[0].zero_()
        b1.W_K[0][:5] = torch.randn(5, 5, dtype=torch.float64)  # keys read dims 0..4 only
        b1.W_Q[0][:5] = 0.0  # queries ignore them
        b1.W_Q[0][5:10] = torch.randn(5, 5, dtype=torch.float64)
    k = qkov.composition_scores(model, "K", subtract_baseline=False)[0, 0, 1, 0]
    q = qkov.composition_scores(model, "Q", subtract_baseline=False)[0, 0, 1, 0]
    assert float(q) == pytest.approx(0.0, abs=1e-12)
    assert float(k) == pytest.approx(float(dense_score("K", model, (0, 0), (1, 0))), rel=1e-10)
    assert float(k) > 0.3


def test_k_composition_circuit_is_the_dense_token_term_and_its_positivity():
    model = model_3x4()
    b0, b2 = model.blocks[0].attn, model.blocks[2].attn
    circuit = qkov.k_composition_circuit(model, "L0H1", "L2H3")
    dense = (
        (model.W_E @ b2.W_Q[3]) @ (model.W_E @ b0.W_V[1] @ b0.W_O[1] @ b2.W_K[3]).T / math.sqrt(5)
    ).detach()
    torch.testing.assert_close(circuit.AB, dense, rtol=1e-12, atol=1e-12)
    positivity = qkov.k_composition_positivity(model)
    eig = torch.linalg.eigvals(dense)
    assert float(positivity[0, 1, 2, 3]) == pytest.approx(float(eig.real.sum() / eig.abs().sum()), rel=1e-8)
    for l1, h1, l2, h2 in itertools.product(range(3), range(4), range(3), range(4)):
        if l1 >= l2:
            assert math.isnan(positivity[l1, h1, l2, h2])
        else:
            fm = qkov.k_composition_circuit(model, f"L{l1}H{h1}", f"L{l2}H{h2}")
            expected = float(qkov.copying_score(fm).detach())
            assert float(positivity[l1, h1, l2, h2]) == pytest.approx(expected, rel=1e-8)
    with pytest.raises(qkov.QkovError, match="earlier layer"):
        qkov.k_composition_circuit(model, "L1H0", "L1H1")


def test_composition_scores_are_factored_quantities():
    """The Gram-root shortcut equals the FactoredMatrix norm of the chained product."""
    model = model_3x4().requires_grad_(False)
    ov = qkov.ov_circuit(model)
    qk = qkov.qk_circuit(model)
    chained: FactoredMatrix = ov[0, 2] @ qk[1, 3].T
    expected = chained.norm() / (ov[0, 2].norm() * qk[1, 3].norm())
    got = qkov.composition_scores(model, "K", subtract_baseline=False)[0, 2, 1, 3]
    assert float(got) == pytest.approx(float(expected), rel=1e-10)


def test_a_pointer_arithmetic_induction_head_composes_through_its_queries():
    """Standard positions: the induction head finds its target by Q-composition with a
    duplicate-token head that writes 'earlier position + 1' (no previous-token head at all)."""
    model = pointer_arithmetic_model()
    gen = torch.Generator().manual_seed(1)
    tokens = torch.stack([torch.randperm(31, generator=gen)[:5] + 1 for _ in range(8)]).repeat(1, 2)
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens)
    assert float(induction_scores(cache, period=5)[1, 0]) == pytest.approx(1.0, abs=1e-3)
    predicted = logits[:, 5:-1].argmax(-1)
    assert torch.equal(predicted, tokens[:, 6:])  # the second repeat is predicted exactly
    q, k = (qkov.composition_scores(model, kind, subtract_baseline=False) for kind in "QK")
    assert float(q[0, 0, 1, 0]) == pytest.approx(float(q[~q.isnan()].max()))
    assert float(q[0, 0, 1, 0]) > 0.2 and float(k[0, 0, 1, 0]) < 0.05


def test_writers_in_groups_give_the_scores_of_all_at_once():
    """A budget that holds one layer of writers' rows at a time (a pass over the later layers per
    writer layer), or two, gives the scores, and the K-composition term's positivity, of the
    budget that holds them all."""
    from qkov.circuits.composition import all_raw_composition_scores, k_composition_positivity, writer_groups

    model = model_3x4(n_layers=5)
    whole = all_raw_composition_scores(model)
    positivity = k_composition_positivity(model)
    per_layer = 4 * 5 * 24 * 8  # one layer's rows in float64
    assert [len(g) for g in writer_groups(5, per_layer, per_layer)] == [1, 1, 1, 1]
    assert [list(g) for g in writer_groups(5, per_layer, 3 * per_layer)] == [[0, 1, 2], [3]]
    for budget in (1, 2 * per_layer):
        grouped = all_raw_composition_scores(model, memory_bytes=budget)
        for kind in ("Q", "K", "V"):
            torch.testing.assert_close(grouped[kind], whole[kind], equal_nan=True, rtol=1e-12, atol=0)
        torch.testing.assert_close(
            k_composition_positivity(model, memory_bytes=budget),
            positivity,
            equal_nan=True,
            rtol=1e-12,
            atol=1e-14,
        )
    assert torch.isnan(whole["K"][4]).all() and not torch.isnan(whole["K"][3, :, 4]).any()


def test_repeated_heads_finds_the_runs_of_equal_heads():
    from qkov.circuits.composition import repeated_heads

    distinct = torch.randn(8, 3, 2, dtype=torch.float64)
    assert repeated_heads(distinct) == 1
    assert repeated_heads(distinct[::4].repeat_interleave(4, 0)) == 4
    assert repeated_heads(distinct[:1].expand(8, 3, 2)) == 8
    assert repeated_heads(distinct[::2].repeat(2, 1, 1)) == 1  # equal heads, but not in runs
    nearly = distinct[::2].repeat_interleave(2, 0).clone()
    nearly[5, 0, 0] = torch.nextafter(nearly[5, 0, 0], torch.tensor(math.inf, dtype=torch.float64))  # one ulp
    assert repeated_heads(nearly) == 1


def test_grouped_query_attention_shares_its_products_and_keeps_every_pairs_positivity():
    """Grouped-query attention with rotary positions, in its circuit view: each key and value head
    repeated over its group of 2 query heads. The positivity made once per group is every pair's
    dense token-level term's, in float64."""
    from qkov.circuits.composition import repeated_heads

    cfg = qkov.Config(
        n_layers=3, n_heads=4, d_model=24, d_head=6, d_vocab=31, n_ctx=8, positional_embedding="rotary",
        n_key_value_heads=2, normalization="RMS",
    )  # fmt: skip
    model = random_model(cfg, seed=3).double()
    view = circuit_model(model)
    assert repeated_heads(view.blocks[1].attn.W_K) == repeated_heads(view.blocks[0].attn.W_V) == 2
    positivity = qkov.k_composition_positivity(model)
    for l1, h1, l2, h2 in itertools.product(range(3), range(4), range(3), range(4)):
        if l1 < l2:
            fm = qkov.k_composition_circuit(model, f"L{l1}H{h1}", f"L{l2}H{h2}")
            eig = torch.linalg.eigvals(fm.AB.detach())
            expected = float(eig.real.sum() / eig.abs().sum())
            assert float(positivity[l1, h1, l2, h2]) == pytest.approx(expected, rel=1e-7, abs=1e-9)
