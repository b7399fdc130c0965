"""Skip-trigrams through one source or one destination token (what the explorer shows): against a
dense float64 brute force over every triple, and against the strongest skip-trigrams of the head."""

from __future__ import annotations

import pytest
import torch

from qkov.circuits import skip_trigrams
from qkov.circuits.skip_trigrams import head_circuits, skip_trigrams_through, strongest_skip_trigrams
from qkov.errors import QkovError

from conftest import float64_model
from handbuilt import skip_trigram_model


def dense_strengths(model, layer: int, head: int, tokens: torch.Tensor) -> torch.Tensor:
    """Every triple's strength ``[source, destination, out]`` from the dense float64 circuits over
    ``tokens``: ``qk(destination, source) * ov(source, out)``, each circuit's rows centred, and
    ``-inf`` unless both are positive."""
    attn = model.blocks[layer].attn
    W_E, W_U = model.W_E.double()[tokens], model.W_U.double()[:, tokens]
    qk = W_E @ attn.W_Q[head].double() @ attn.W_K[head].double().T @ W_E.T / attn.d_head**0.5
    ov = W_E @ attn.W_V[head].double() @ attn.W_O[head].double() @ W_U
    qk, ov = qk - qk.mean(1, keepdim=True), ov - ov.mean(1, keepdim=True)
    strength = qk.T[:, :, None] * ov[:, None, :]
    return strength.masked_fill((qk.T[:, :, None] <= 0) | (ov[:, None, :] <= 0), -torch.inf)


def brute_force(strength: torch.Tensor, tokens: torch.Tensor, k: int, source=None, destination=None):
    """The ``k`` strongest triples through a source or destination token, by sorting all of them."""
    row = {int(t): i for i, t in enumerate(tokens)}
    index = torch.arange(len(tokens))
    s, d, o = torch.meshgrid(index, index, index, indexing="ij")
    keep = (s == row[source]) if source is not None else (d == row[destination])
    values, order = strength[keep].sort(descending=True)
    triples = torch.stack([s[keep], d[keep], o[keep]], dim=1)[order]
    return [
        (*(int(tokens[i]) for i in triple), float(value))
        for triple, value in zip(triples[:k], values[:k], strict=True)
        if value > -torch.inf
    ]


def rows(trigrams):
    return [(t.source, t.destination, t.out) for t in trigrams], [t.strength for t in trigrams]


@pytest.mark.parametrize("allowed", [None, "every other token"])
def test_through_each_token_is_the_brute_force_and_the_strongest(allowed):
    model = float64_model(n_layers=1, seed=3).requires_grad_(False)
    mask = None if allowed is None else torch.arange(model.cfg.d_vocab) % 2 == 0
    for head in range(model.cfg.n_heads):
        circuits = head_circuits(model, 0, head, mask)
        tokens = circuits.tokens
        strength = dense_strengths(model, 0, head, tokens)
        n = len(tokens)
        everything = strongest_skip_trigrams(circuits, k=n**3)  # every positive triple, strongest first
        for token in tokens.tolist():
            for end in ("source", "destination"):
                got = skip_trigrams_through(circuits, k=7, **{end: token})
                want = brute_force(strength, tokens, 7, **{end: token})
                assert rows(got)[0] == [w[:3] for w in want], (head, end, token)
                assert rows(got)[1] == pytest.approx([w[3] for w in want], rel=1e-12)
                strongest = [t for t in everything if getattr(t, end) == token][:7]
                assert rows(got)[0] == rows(strongest)[0]
                assert rows(got)[1] == pytest.approx(rows(strongest)[1], rel=1e-12)
                assert all(t.strength == t.qk * t.ov and t.qk > 0 and t.ov > 0 for t in got)


def test_the_planted_skip_trigrams_and_their_bugs():
    circuits = head_circuits(skip_trigram_model([(5, 3, 9), (5, 4, 10)]), 0, 0)
    by_source = skip_trigrams_through(circuits, source=5, k=4)
    assert {(t.destination, t.out) for t in by_source} == {(3, 9), (4, 10), (3, 10), (4, 9)}
    assert [(t.source, t.out) for t in skip_trigrams_through(circuits, destination=3, k=2)] == [
        (5, 9),
        (5, 10),
    ]
    assert skip_trigrams_through(circuits, source=6, k=4) == []  # a token no head attends to


def test_through_a_destination_streams_sources_with_progress(monkeypatch):
    model = float64_model(n_layers=1, seed=4)
    circuits = head_circuits(model, 0, 1)
    whole = skip_trigrams_through(circuits, destination=11, k=9)
    monkeypatch.setattr(skip_trigrams, "SOURCE_BLOCK", 5)  # 23 sources: blocks of 5, 5, 5, 5, 3
    seen = []
    blocked = skip_trigrams_through(circuits, destination=11, k=9, progress=lambda *step: seen.append(step))
    assert seen == [(0, 23), (5, 23), (10, 23), (15, 23), (20, 23)]
    # the same triples; strengths to float64 rounding (a block of 5 sources is another matmul shape,
    # whose sums BLAS may order otherwise: 1 ulp apart was seen)
    assert rows(blocked)[0] == rows(whole)[0] and len(whole) == 9
    assert rows(blocked)[1] == pytest.approx(rows(whole)[1], rel=1e-13)


def test_bad_ends_are_refused():
    circuits = head_circuits(float64_model(n_layers=1), 0, 0, torch.arange(23) < 10)
    with pytest.raises(QkovError, match="give exactly one of source and destination"):
        skip_trigrams_through(circuits, k=3)
    with pytest.raises(QkovError, match="give exactly one of source and destination"):
        skip_trigrams_through(circuits, source=1, destination=2, k=3)
    with pytest.raises(QkovError, match="token 15 is not among the tokens searched"):
        skip_trigrams_through(circuits, source=15, k=3)
