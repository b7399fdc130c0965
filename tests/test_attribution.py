"""Exact attention-score attribution: the (query part x key part) terms sum to the head's scores in
float64 (1-3 layers, both position schemes, with and without LayerNorm, MLPs and biases), the
patterns they give are the independent reference's, each earlier head's parts sum to its write, and
the hand-built induction head's terms are the planted numbers."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import qkov
from qkov.circuits.attribution import induction_target_shares, score_parts, stream_parts, variance_shares
from qkov.circuits.paths import freeze
from qkov.data.random_tokens import repeated_random_tokens
from qkov.names import head_name, hook_name

from conftest import float64_model, tokens_for
from handbuilt import induction_model, pointer_arithmetic_model
from reference import reference_forward

VARIANTS = [
    {},
    {"normalization": "LN"},
    {"normalization": "LNPre"},
    {"normalization": "LN", "d_mlp": 8, "act_fn": "gelu"},
]


def model_scores(model, tokens, layer: int, head: int) -> torch.Tensor:
    """The head's pre-softmax scores as the model computes them, from its own cache."""
    _, cache = model.run_with_cache(tokens)
    block = model.blocks[layer]
    resid = cache[hook_name(layer, "resid_pre")]
    x = resid if block.ln1 is None else block.ln1(resid)
    _, qk_positions = model.embed(model.check_tokens(tokens))
    q, k, _ = block.attn.qkv(x, qk_positions)
    return (q @ k.mT)[:, head] / math.sqrt(model.cfg.d_head)


@pytest.mark.parametrize("n_layers", [1, 2, 3])
@pytest.mark.parametrize("positions", ["shortformer", "standard"])
@pytest.mark.parametrize("variant", VARIANTS, ids=["plain", "LN", "LNPre", "LN+MLP"])
@pytest.mark.parametrize("biases", [False, True])
def test_the_terms_sum_to_the_scores_in_float64(n_layers, positions, variant, biases):
    model = float64_model(n_layers, positions, biases=biases, **variant)
    tokens = tokens_for(model)
    layer = n_layers - 1
    terms = qkov.score_attribution(model, tokens, head_name(layer, 1))
    total = sum(terms.values())
    scores = model_scores(model, tokens, layer, 1)
    causal = torch.ones(scores.shape[-2:], dtype=torch.bool).tril()
    scale = scores.abs().max()
    assert (total - scores)[..., causal].abs().max() < 1e-12 * scale
    assert all((term[..., ~causal] == 0).all() for term in terms.values())
    # the pattern they give is the independent float64 reference's
    weights = {name: p.detach().numpy() for name, p in model.named_parameters()}
    _, patterns, _, _ = reference_forward(weights, model.cfg, tokens.numpy())
    pattern = total.masked_fill(~causal, -math.inf).softmax(-1)
    np.testing.assert_allclose(pattern.numpy(), patterns[layer][:, 1], atol=1e-10)


@pytest.mark.parametrize("positions", ["shortformer", "standard"])
@pytest.mark.parametrize("variant", VARIANTS, ids=["plain", "LN", "LNPre", "LN+MLP"])
def test_each_earlier_head_is_split_into_parts_that_sum_to_its_write(positions, variant):
    model = float64_model(3, positions, biases=True, **variant)
    tokens = tokens_for(model)
    _, cache = model.run_with_cache(tokens)
    frozen = freeze(model, tokens)
    parts = stream_parts(model, model.check_tokens(tokens), 2, frozen)
    assert (sum(parts.values()) - cache[hook_name(2, "resid_pre")]).abs().max() < 1e-12
    suffixes = ["", ".bias"] + [".pos"] * (positions == "standard")
    for layer in range(2):
        mlp = [".mlp"] * (layer > 0 and model.cfg.has_mlp)
        for head in range(model.cfg.n_heads):
            name = head_name(layer, head)
            expected = sorted(name + s for s in suffixes + mlp)
            assert sorted(p for p in parts if p.split(".")[0] == name) == expected
            write = sum(parts[name + s] for s in suffixes + mlp)
            assert (write - cache[hook_name(layer, "result")][:, :, head]).abs().max() < 1e-12
    assert ("L0MLP" in parts) == model.cfg.has_mlp


def test_parts_that_are_zero_by_construction_are_left_out():
    short = score_parts(float64_model(2, "shortformer"), tokens_for(float64_model(2)), "L1H0")
    assert short.names == ["embed", "L0H0", "L0H1", "L0H2", "pos_embed"]  # values never see positions
    standard = score_parts(float64_model(2, "standard"), tokens_for(float64_model(2)), "L1H0")
    assert standard.names[:2] == ["embed", "pos_embed"] and "L0H2.pos" in standard.names
    assert "bias" not in standard.names
    layer_norm = float64_model(2, normalization="LN")
    assert "bias" in score_parts(layer_norm, tokens_for(layer_norm), "L1H0").names  # LayerNorm's b


def test_the_handbuilt_induction_head_reads_the_planted_terms():
    """L1H0 scores 100 for "my token is the source's previous token" (embed x L0H0, L0H0 the
    previous-token head) and 12 per source position for recency (embed x pos_embed, from the constant
    coordinate of every token's embedding)."""
    model = induction_model().double()
    period = 4
    tokens = repeated_random_tokens(2, period, 3, model.cfg.d_vocab, torch.Generator().manual_seed(0))
    terms = qkov.score_attribution(model, tokens, "L1H0")
    dests = torch.arange(period, 3 * period)
    k_composition = terms[("embed", "L0H0")]
    # (the planted weights are float32: 100 to 1e-7 relative)
    assert (k_composition[:, dests, dests - period + 1] - 100.0).abs().max() < 1e-5
    src = torch.arange(3 * period, dtype=torch.float64)
    recency = terms[("embed", "pos_embed")][:, -1]
    assert (recency - 12.0 * src).abs().max() < 1e-5
    assert terms[("pos_embed", "pos_embed")].abs().max() < 1e-9  # its queries read no position


@pytest.mark.parametrize("build", [induction_model, pointer_arithmetic_model])
def test_the_target_shares_are_the_dense_margins_of_every_term(build):
    model = build().double()
    period = 4
    tokens = repeated_random_tokens(3, period, 3, model.cfg.d_vocab, torch.Generator().manual_seed(2))
    terms = qkov.score_attribution(model, tokens, "L1H0")
    shares = induction_target_shares(score_parts(model, tokens, "L1H0"), period)

    def dense_margin(scores: torch.Tensor) -> float:
        margins = []
        for dest in range(period, 3 * period):
            target = dest - period + 1
            others = [s for s in range(dest + 1) if s != target]
            margins.append(scores[:, dest, target] - scores[:, dest, others].mean(-1))
        return float(torch.stack(margins).mean())

    assert shares.margin == pytest.approx(dense_margin(sum(terms.values())), rel=1e-12)
    for i, query in enumerate(shares.names):
        for j, key in enumerate(shares.names):
            expected = dense_margin(terms[(query, key)])
            assert float(shares.contributions[i, j]) == pytest.approx(expected, abs=1e-9 * abs(shares.margin))
    assert float(shares.shares.sum()) == pytest.approx(1.0, abs=1e-12)


def test_bad_input_is_one_clear_error():
    model = float64_model(2)
    with pytest.raises(qkov.QkovError, match="no head L2H0"):
        qkov.score_attribution(model, tokens_for(model), "L2H0")
    with pytest.raises(qkov.QkovError, match="period"):
        induction_target_shares(score_parts(model, tokens_for(model), "L1H0"), 10)


def test_the_variance_shares_sum_to_one_and_ignore_row_constants():
    model = float64_model(2, "standard", biases=True, normalization="LN")
    terms = qkov.score_attribution(model, tokens_for(model), "L1H0")
    shares = variance_shares(terms)
    assert sum(shares.values()) == pytest.approx(1.0, abs=1e-12)
    # a dense reference for one term, with loops over rows
    pair = max(shares, key=lambda p: abs(shares[p]))
    total = sum(terms.values())
    num = den = 0.0
    for b in range(total.shape[0]):
        for dest in range(total.shape[1]):
            t, s = terms[pair][b, dest, : dest + 1], total[b, dest, : dest + 1]
            num += float(((t - t.mean()) * (s - s.mean())).sum())
            den += float(((s - s.mean()) ** 2).sum())
    assert shares[pair] == pytest.approx(num / den, rel=1e-10)
    # a term that shifts whole rows gets nothing; the rest then carries everything
    rows = torch.arange(5, dtype=torch.float64)[None, :, None].expand(2, 5, 5).tril()
    varying = torch.randn(2, 5, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).tril()
    toy = variance_shares({("a", "b"): rows, ("c", "d"): varying})
    assert toy[("a", "b")] == pytest.approx(0.0, abs=1e-12) and toy[("c", "d")] == pytest.approx(1.0)
