"""QK and OV circuits, full and factored, at token and position level, against dense float64
computations and the independent reference model."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

import qkov

from conftest import float64_model, tokens_for


# -- circuits ----------------------------------------------------------------------------------
def test_qk_and_ov_circuits_are_each_heads_dense_products():
    model = float64_model(3)
    qk, ov = qkov.qk_circuit(model), qkov.ov_circuit(model)
    assert qk.shape == ov.shape == (3, 3, 16, 16)
    for layer, head in itertools.product(range(3), range(3)):
        attn = model.blocks[layer].attn
        torch.testing.assert_close(
            qk[layer, head].AB, attn.W_Q[head] @ attn.W_K[head].T, rtol=1e-12, atol=1e-12
        )
        torch.testing.assert_close(
            ov[layer, head].AB, attn.W_V[head] @ attn.W_O[head], rtol=1e-12, atol=1e-12
        )
        # the paper's column-vector forms are the transposes
        paper_ov = attn.W_O[head].T @ attn.W_V[head].T
        torch.testing.assert_close(ov[layer, head].AB.T, paper_ov, rtol=1e-12, atol=1e-12)


def test_full_ov_circuit_is_the_token_to_logit_map_of_a_head():
    model = float64_model(1, "none")
    attn = model.blocks[0].attn
    full = qkov.full_ov_circuit(model)
    assert full.shape == (1, 3, 23, 23)
    torch.testing.assert_close(full[0, 1].AB, model.W_E @ attn.W_V[1] @ attn.W_O[1] @ model.W_U)


def test_full_qk_circuit_gives_the_first_layers_attention_pattern():
    """With no positions, softmax over the causal row of W_E W_QK W_E^T / sqrt(d_head) is the pattern."""
    model = float64_model(1, "none")
    tokens = tokens_for(model, batch=2)
    _, cache = model.run_with_cache(tokens)
    scores = qkov.full_qk_circuit(model).AB[0][:, tokens[:, :, None], tokens[:, None, :]]  # [head, b, d, s]
    causal = torch.ones(10, 10, dtype=torch.bool).tril()
    pattern = scores.masked_fill(~causal, -math.inf).softmax(-1).permute(1, 0, 2, 3)
    torch.testing.assert_close(pattern, cache["blocks.0.attn.hook_pattern"], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("scheme", ["shortformer", "standard"])
def test_qk_terms_sum_to_the_first_layers_attention_scores(scheme):
    model = float64_model(1, scheme)
    tokens = tokens_for(model, batch=2)
    _, cache = model.run_with_cache(tokens)
    terms = {name: fm.AB[0] for name, fm in qkov.qk_terms(model)._asdict().items()}
    pos = torch.arange(10)
    scores = (
        terms["token_token"][:, tokens[:, :, None], tokens[:, None, :]]
        + terms["token_pos"][:, tokens[:, :, None], pos[None, None, :]]
        + terms["pos_token"][:, pos[None, :, None], tokens[:, None, :]]
        + terms["pos_pos"][:, pos[None, :, None], pos[None, None, :]]
    )
    causal = torch.ones(10, 10, dtype=torch.bool).tril()
    pattern = scores.masked_fill(~causal, -math.inf).softmax(-1).permute(1, 0, 2, 3)
    torch.testing.assert_close(pattern, cache["blocks.0.attn.hook_pattern"], rtol=1e-12, atol=1e-12)
    rms = qkov.qk_term_rms(model)
    for name, dense in terms.items():
        torch.testing.assert_close(rms[name][0], dense.pow(2).mean((-1, -2)).sqrt(), rtol=1e-10, atol=0)


def test_qk_terms_need_positions():
    with pytest.raises(qkov.QkovError, match="no positional embedding"):
        qkov.qk_terms(float64_model(1, "none"))


def test_a_model_without_layers_has_no_circuits():
    with pytest.raises(qkov.QkovError, match="no attention heads"):
        qkov.ov_circuit(float64_model(0))
