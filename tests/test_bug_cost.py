"""What skip-trigram bugs cost: on hand-built one-layer models with planted bugs, and on random
float64 ones, the cost equals a dense float64 computation (independent forward, the bugged terms
removed from the full logits, explicit log-softmax)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import qkov
from qkov.analyze import Context, run_steps
from qkov.circuits.bug_cost import bug_cost, bugged_triples
from qkov.circuits.skip_trigrams import skip_trigram_tables
from qkov.data.tokens import TokenSplits
from qkov.errors import QkovError
from qkov.names import head_name
from qkov.report.sections import skip_trigram_section

from conftest import float64_model, tokens_for
from handbuilt import skip_trigram_model
from reference import reference_forward

# (5, 3, 9) and (5, 4, 10) occur; so does the crossed (5, 3, 10) within 8 tokens, never (5, 4, 9)
ONE_BUG_CORPUS = np.array([5, 1, 1, 3, 9, 2, 2, 5, 4, 10, 2, 3, 10])
TWO_BUG_CORPUS = np.array([5, 3, 9, 0, 0, 0, 0, 0, 0, 0, 5, 4, 10])  # neither crossing occurs


def weights(model) -> dict[str, np.ndarray]:
    return {name: p.detach().double().numpy() for name, p in model.state_dict().items()}


def mean_loss(logits: np.ndarray, tokens: np.ndarray) -> float:
    """Next-token cross-entropy, log-softmax written out."""
    predicted, targets = logits[:, :-1], tokens[:, 1:]
    top = predicted.max(-1, keepdims=True)
    log_z = np.log(np.exp(predicted - top).sum(-1)) + top[..., 0]
    picked = np.take_along_axis(predicted, targets[..., None], -1)[..., 0]
    return float((log_z - picked).mean())


def full_ov(model, head: int) -> np.ndarray:
    w, p = weights(model), "blocks.0.attn."
    return w["W_E"] @ w[p + "W_V"][head] @ w[p + "W_O"][head] @ w["W_U"]


def dense_cost(model, tokens: torch.Tensor, removed: list[tuple[int, int, int, int]]) -> tuple[float, int]:
    """The model's loss minus its loss with each ``(head, source, destination, out)`` term removed
    from the full float64 logits, position by position; and how many positions it fired at."""
    toks = tokens.numpy()
    logits, patterns, _, _ = reference_forward(weights(model), model.cfg, toks)
    edited, fired = logits.copy(), set()
    for head, source, destination, out in removed:
        ov = full_ov(model, head)
        centred = ov[source, out] - ov[source].mean()
        for b, d in np.argwhere(toks[:, :-1] == destination):
            for s in range(d + 1):
                if toks[b, s] == source and patterns[0][b, head, d, s] > 0:
                    edited[b, d, out] -= patterns[0][b, head, d, s] * centred
                    fired.add((head, b, d))
    return mean_loss(logits, toks) - mean_loss(edited, toks), len(fired)


def held_out(d_vocab: int = 16) -> torch.Tensor:
    """Random text with the planted patterns in it: ``5 … 4`` followed by 9 (the bug helps) and by
    10 (it hurts), and ``5 … 3`` followed by 10."""
    planted = torch.tensor([[5, 1, 4, 9, 2, 5, 4, 10], [5, 3, 10, 2, 4, 10, 3, 9]])
    return torch.cat([planted, tokens_for(skip_trigram_model([]), batch=6, pos=8, seed=2) % d_vocab])


def test_the_cost_of_one_planted_bug_equals_the_dense_computation():
    model = skip_trigram_model([(5, 3, 9), (5, 4, 10)]).double()
    tables = skip_trigram_tables(model, corpus=ONE_BUG_CORPUS)
    assert [triple[:3] for triple in bugged_triples(tables.bugs)["L0H0"]] == [(5, 4, 9)]
    tokens = held_out()
    cost = bug_cost(model, tables.bugs, tokens)
    expected, fired = dense_cost(model, tokens, [(0, 5, 4, 9)])
    assert cost.terms == 1 and len(cost.top) == 1
    (term,) = cost.top
    assert (term.head, term.source, term.destination, term.out, term.fires) == ("L0H0", 5, 4, 9, fired)
    assert fired >= 3 and expected != 0
    for value in (cost.nats_per_token, cost.by_head["L0H0"], term.nats_per_token):
        assert value == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert term.ov == pytest.approx(5.0 - 10.0 / 16, rel=1e-12)  # OV row 5 is 5 at outs 9 and 10, centred
    assert cost.by_head["L0H1"] == 0.0 and cost.by_head["L0H2"] == 0.0  # no skip-trigrams, no bugs


def test_two_bugs_cost_jointly_what_the_dense_computation_gives():
    model = skip_trigram_model([(5, 3, 9), (5, 4, 10)]).double()
    tables = skip_trigram_tables(model, corpus=TWO_BUG_CORPUS)
    tokens = held_out()
    cost = bug_cost(model, tables.bugs, tokens)
    assert {(t.source, t.destination, t.out) for t in cost.top} == {(5, 4, 9), (5, 3, 10)}
    both, _ = dense_cost(model, tokens, [(0, 5, 4, 9), (0, 5, 3, 10)])
    assert (
        cost.nats_per_token == pytest.approx(both, rel=1e-9) and cost.by_head["L0H0"] == cost.nats_per_token
    )
    for term in cost.top:
        alone, fired = dense_cost(model, tokens, [(0, term.source, term.destination, term.out)])
        assert term.nats_per_token == pytest.approx(alone, rel=1e-9) and term.fires == fired
    assert [t.nats_per_token for t in cost.top] == sorted((t.nats_per_token for t in cost.top), reverse=True)


def test_the_heads_gain_and_the_shares_match_the_dense_losses():
    model = skip_trigram_model([(5, 3, 9), (5, 4, 10)]).double()
    tokens = held_out()
    cost = bug_cost(model, skip_trigram_tables(model, corpus=ONE_BUG_CORPUS).bugs, tokens)
    toks, w = tokens.numpy(), weights(model)
    logits, patterns, writes, _ = reference_forward(w, model.cfg, toks)
    direct = w["W_E"][toks] @ w["W_U"]
    assert cost.heads_gain == pytest.approx(mean_loss(direct, toks) - mean_loss(logits, toks), rel=1e-9)
    for head in range(model.cfg.n_heads):
        alone = mean_loss(direct, toks) - mean_loss(direct + writes[0][:, :, head] @ w["W_U"], toks)
        assert cost.head_gain[head_name(0, head)] == pytest.approx(alone, rel=1e-9, abs=1e-12)
    assert cost.share == pytest.approx(cost.nats_per_token / cost.heads_gain)
    assert cost.share_by_head["L0H0"] == pytest.approx(cost.by_head["L0H0"] / cost.head_gain["L0H0"])


@pytest.mark.parametrize("scheme,biases", [("standard", True), ("shortformer", False)])
def test_on_random_models_the_cost_equals_the_dense_computation(scheme, biases):
    model = float64_model(1, scheme, biases=biases, seed=5)
    corpus = np.random.default_rng(0).integers(0, model.cfg.d_vocab, 40)
    tables = skip_trigram_tables(model, k=30, corpus=corpus)
    triples = bugged_triples(tables.bugs)
    assert sum(map(len, triples.values())) >= 2
    tokens = tokens_for(model, batch=4)
    cost = bug_cost(model, tables.bugs, tokens)
    every = [(int(name[3:]), a, b, c) for name, found in triples.items() for a, b, c, _ in found]
    assert cost.nats_per_token == pytest.approx(dense_cost(model, tokens, every)[0], rel=1e-7, abs=1e-12)
    for name, found in triples.items():
        mine = [(int(name[3:]), a, b, c) for a, b, c, _ in found]
        assert cost.by_head[name] == pytest.approx(dense_cost(model, tokens, mine)[0], rel=1e-7, abs=1e-12)


def test_crossings_seen_in_the_corpus_and_text_where_a_bug_never_fires_cost_nothing():
    model = skip_trigram_model([(5, 3, 9), (5, 4, 10)]).double()
    seen_everywhere = np.array([5, 3, 9, 5, 3, 10, 5, 4, 10, 5, 4, 9])
    cost = bug_cost(model, skip_trigram_tables(model, corpus=seen_everywhere).bugs, held_out())
    assert cost.terms == 0 and cost.top == [] and cost.nats_per_token == 0.0
    no_source = torch.tensor([[1, 4, 9, 2, 4, 10, 3, 9]])
    cost = bug_cost(model, skip_trigram_tables(model, corpus=TWO_BUG_CORPUS).bugs, no_source)
    assert cost.terms == 2 and all(t.fires == 0 for t in cost.top) and cost.nats_per_token == 0.0


def test_what_the_bug_cost_refuses():
    model = skip_trigram_model([(5, 3, 9), (5, 4, 10)])
    with pytest.raises(QkovError, match="checked against a corpus"):
        bug_cost(model, skip_trigram_tables(model).bugs, held_out())
    bugs = skip_trigram_tables(model, corpus=ONE_BUG_CORPUS).bugs
    with pytest.raises(QkovError, match="at least 2 tokens"):
        bug_cost(model, bugs, torch.tensor([[5]]))
    for other in (float64_model(1, normalization="LN"), float64_model(2)):
        with pytest.raises(QkovError, match="one-layer models without LayerNorm"):
            bug_cost(other, bugs, held_out())


def test_the_skip_trigram_step_fills_the_bug_cost_with_a_corpus_and_the_report_shows_it():
    model = skip_trigram_model([(5, 3, 9), (5, 4, 10)])
    eval_text = np.random.default_rng(0).integers(0, 16, 400)
    corpus = TokenSplits(np.tile(TWO_BUG_CORPUS, 25), eval_text)  # every planted token seen often enough
    found = run_steps(model, ["skip_trigrams"], corpus)["skip_trigrams"]
    ctx = Context.of(model.eval(), corpus, 0, {})
    expected = bug_cost(ctx.circuit, found.bugs, ctx.text, "corpus (eval split)")
    assert dataclasses.replace(found.bug_cost, covers="") == expected and found.bug_cost.terms == 2
    assert found.bug_cost.covers.startswith("the crossings among each head's 50 strongest skip-trigrams only")
    assert "lower bound" in found.bug_cost.covers
    assert run_steps(model, ["skip_trigrams"])["skip_trigrams"].bug_cost is None
    strings = [f"#{i}" for i in range(16)]
    results = qkov.Results(
        config=model.cfg, tokens=strings, training=[], phase_change=None, skip_trigrams=found
    )
    html = skip_trigram_section(results)
    assert "What the bugs cost" in html and f"{found.bug_cost.nats_per_token:.3g} nats" in html
    # shares as percentages (a later helper of the same name once printed them as "+0.00")
    assert f"loss without): {100 * found.bug_cost.share:.3g}% of the" in html
