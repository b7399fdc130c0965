"""The hand-built models (``qkov.handbuilt``) compute what they were built to, read straight from
their weights and their forward in float64: the other tests use them as known answers, so these are
the answers checked once, without any analysis of qkov's in between."""

from __future__ import annotations

import math

import pytest
import torch

from qkov.handbuilt import (
    blocks_model,
    induction_model,
    pointer_arithmetic_model,
    skip_trigram_model,
    two_back_model,
    with_layer_norm,
)

PLANTED = [(5, 3, 9), (5, 4, 10), (7, 2, 11)]  # (source, destination, out)


def patterns(model, tokens: torch.Tensor, layer: int) -> torch.Tensor:
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens[None])
    return cache[f"blocks.{layer}.attn.hook_pattern"][0]  # [head, dest, src]


def test_induction_models_l0h0_attends_one_back():
    model = induction_model().double()
    tokens = torch.tensor([7, 1, 9, 30, 7, 1, 9, 30, 2, 63, 0, 5])
    pattern = patterns(model, tokens, 0)[0]
    torch.testing.assert_close(pattern[1:].diagonal(), torch.ones(11).double(), rtol=0, atol=1e-12)
    assert pattern[0, 0] == 1.0  # position 0 has only itself


def test_induction_models_l1h0_attends_after_the_earlier_occurrence_and_copies():
    model = induction_model().double()
    tokens = torch.tensor([7, 1, 9, 30, 7, 1, 9, 30, 7, 1, 9, 30])
    pattern = patterns(model, tokens, 1)[0]
    for dest in range(4, 12):  # the most recent earlier occurrence of tokens[dest] is dest - 4
        assert float(pattern[dest, dest - 3]) == pytest.approx(1.0, abs=1e-5)
    predicted = model(tokens[None])[0].argmax(-1)
    assert predicted[4:11].tolist() == tokens[5:12].tolist()  # every token of the second period on


def test_the_induction_heads_ov_circuit_is_twenty_times_the_identity_on_tokens():
    model = induction_model(d_vocab=8, n_ctx=5).double()
    attn = model.blocks[1].attn
    ov = model.W_E @ attn.W_V[0] @ attn.W_O[0] @ model.W_U
    torch.testing.assert_close(ov, 20 * torch.eye(8, dtype=torch.float64), rtol=0, atol=1e-12)


def test_skip_trigram_models_planted_triples_are_its_strongest():
    model = skip_trigram_model(PLANTED).double()
    attn = model.blocks[0].attn
    qk = model.W_E @ attn.W_Q[0] @ attn.W_K[0].T @ model.W_E.T  # [destination, source]
    ov = model.W_E @ attn.W_V[0] @ attn.W_O[0] @ model.W_U  # [source, out]
    expected_qk, expected_ov = torch.zeros(16, 16, dtype=torch.float64), torch.zeros_like(qk)
    for source, destination, out in PLANTED:
        expected_qk[destination, source] = 64.0
        expected_ov[source, out] = 5.0
    assert torch.equal(qk, expected_qk) and torch.equal(ov, expected_ov)
    for head, sign in ((1, 1.0), (2, -1.0)):  # copying and anti-copying, with uniform attention
        a = model.blocks[0].attn
        assert torch.equal(model.W_E @ a.W_V[head] @ a.W_O[head] @ model.W_U, sign * torch.eye(16).double())
        assert not (model.W_E @ a.W_Q[head] @ a.W_K[head].T).any()


def test_a_skip_trigram_raises_its_out_token_by_five_times_its_attention():
    """``source ... destination -> out``: the destination's query meets the source's key with a
    score of ``64 / sqrt(16) = 16`` against 0 for the two other tokens, and the copying and
    anti-copying heads cancel, so the logits are the destination's own (1) plus
    ``5 e^16 / (e^16 + 2)`` on each out token of the source."""
    model = skip_trigram_model(PLANTED).double()
    logits = model(torch.tensor([[5, 1, 3]]))[0, 2]
    weight = math.exp(16) / (math.exp(16) + 2)
    expected = torch.zeros(16, dtype=torch.float64)
    expected[3], expected[9], expected[10] = 1.0, 5 * weight, 5 * weight
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-12)


def test_pointer_arithmetic_attends_to_the_earlier_occurrence_and_predicts_what_followed():
    model = pointer_arithmetic_model().double()
    tokens = torch.tensor([3, 9, 4, 7, 1, 3, 9, 4, 7, 1, 3, 9])
    duplicate = patterns(model, tokens, 0)[0]
    for dest in range(5, 10):
        assert float(duplicate[dest, dest - 5]) == pytest.approx(1.0, abs=1e-6)  # not itself
    predicted = model(tokens[None])[0].argmax(-1)
    assert predicted[5:11].tolist() == tokens[6:12].tolist()


def test_two_back_predicts_the_token_two_back_only_through_both_heads():
    model = two_back_model().double()
    tokens = torch.arange(1, 13)
    predicted = model(tokens[None])[0].argmax(-1)
    assert predicted[2:].tolist() == tokens[:-2].tolist()
    for layer in (0, 1):
        pattern = patterns(model, tokens, layer)[0]
        torch.testing.assert_close(pattern[1:].diagonal(), torch.ones(11).double(), rtol=0, atol=1e-12)


def test_blocks_model_writes_tokens_and_positions_one_hot():
    model = blocks_model(d_vocab=5, n_ctx=3, d_model=10, d_head=2)
    assert torch.equal(model.W_E[:, :5], torch.eye(5)) and not model.W_E[:, 5:].any()
    assert torch.equal(model.W_pos[:, 5:8], torch.eye(3)) and not model.W_pos[:, :5].any()
    assert torch.equal(model.W_U[:5], torch.eye(5)) and not model.W_U[5:].any()
    for block in model.blocks:
        attn = block.attn
        assert not any(W[0].any() for W in (attn.W_Q, attn.W_K, attn.W_V, attn.W_O))  # left to the caller
        assert 0 < attn.W_Q[1].abs().max() < 0.1  # small and random


def test_with_layer_norm_keeps_every_prediction():
    model = induction_model().double()
    mirrored = with_layer_norm(model).double()
    assert mirrored.cfg.normalization == "LN" and mirrored.cfg.d_model == 2 * model.cfg.d_model
    tokens = torch.tensor([[7, 1, 9, 30, 7, 1, 9, 30, 7, 1, 9, 30]])
    assert torch.equal(mirrored(tokens).argmax(-1), model(tokens).argmax(-1))
    torch.testing.assert_close(
        patterns(mirrored, tokens[0], 0)[0, 1:].diagonal(), torch.ones(11).double(), rtol=0, atol=1e-9
    )
