"""The explorer's head view (``serve/head.py``): the head scores are the ones analyze writes, the OV
and QK rows are the full circuits, and the skip-trigrams through a token are the brute force's."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

import qkov
from qkov.analyze import analyze
from qkov.circuits.heads import INDUCTION_HEAD, PREVIOUS_TOKEN_HEAD
from qkov.circuits.skip_trigrams import head_circuits, strongest_skip_trigrams
from qkov.serve import build_app
from test_skip_trigrams_through import brute_force, dense_strengths

from conftest import float64_model
from handbuilt import skip_trigram_model
from served import get, ids_of


def test_head_scores_are_the_ones_analyze_writes(served):
    client, model = served
    body = get(client, "/api/heads")
    results = analyze(model, show_progress=False)
    copying, behaviour = results.copying, results.repeated_tokens
    heads = zip(body["heads"], copying.heads, results.copying_direct, behaviour.heads, strict=True)
    for mine, c, d, b in heads:
        assert mine["name"] == c.name == d.name == b.name
        for key in ("copying_score", "copies"):
            assert mine[key] == getattr(c, key), (mine["name"], key)
        for key in ("self_top1", "diagonal_z"):
            assert mine[key] == getattr(d, key), (mine["name"], key)
        for key in ("previous_token_score", "induction_score", "duplicate_token_score"):
            assert mine[key] == getattr(b, key), (mine["name"], key)
        assert [tuple(e) for e in mine["eigenvalues"]] == c.eigenvalues
    assert body["copying_threshold"] == copying.threshold
    assert body["induction_heads"] == behaviour.induction_heads
    assert body["previous_token_heads"] == behaviour.previous_token_heads
    # the page names a head only past analyze's own thresholds, the constants named once
    assert body["previous_token_threshold"] == PREVIOUS_TOKEN_HEAD
    assert body["induction_threshold"] == INDUCTION_HEAD
    spectra = {s.name: s for s in qkov.head_spectra(model, "OV", k=10)}
    assert [h["singular_values"] for h in body["heads"]] == [
        list(spectra[h["name"]].singular_values) for h in body["heads"]
    ]
    scores = {h["name"]: h for h in body["heads"]}
    assert scores["L0H0"]["previous_token_score"] > 0.99
    assert max(scores.values(), key=lambda h: h["induction_score"])["name"] == "L1H0"


def test_ov_and_qk_rows_are_the_full_circuits(served):
    client, model = served
    cat = ids_of(model, "cat")[0]
    body = get(client, "/api/head/L1H0/ov", token=cat, k=5)
    assert body["raised"][0]["str"] == "cat" and body["own_rank"] == 1  # the induction head copies
    for name, (layer, head) in (("L1H0", (1, 0)), ("L0H1", (0, 1))):
        dense_ov = (
            model.W_E @ model.blocks[layer].attn.W_V[head] @ model.blocks[layer].attn.W_O[head] @ model.W_U
        )
        ov = get(client, f"/api/head/{name}/ov", token=cat, k=5)
        assert [t["value"] for t in ov["raised"]] == pytest.approx(
            dense_ov[cat].topk(5).values.tolist(), abs=1e-4
        )
        assert [t["value"] for t in ov["lowered"]] == pytest.approx(
            dense_ov[cat].topk(5, largest=False).values.tolist(), abs=1e-4
        )
        attn = model.blocks[layer].attn
        dense_qk = model.W_E @ attn.W_Q[head] @ attn.W_K[head].T @ model.W_E.T / attn.d_head**0.5
        qk = get(client, f"/api/head/{name}/qk", token=cat, k=5)
        assert [t["value"] for t in qk["preferred"]] == pytest.approx(
            dense_qk[cat].topk(5).values.tolist(), abs=1e-4
        )


def test_skip_trigrams_through_a_source_or_destination(tmp_path):
    folder = qkov.save(skip_trigram_model([(5, 3, 9), (5, 4, 10)]), tmp_path / "one-layer")
    app, jobs = build_app(folder)
    client = TestClient(app, base_url="http://127.0.0.1")
    by_source = get(client, "/api/head/L0H0/skip-trigrams", source=5, k=4)["trigrams"]
    found = {(t["source"]["id"], t["destination"]["id"], t["out"]["id"]) for t in by_source}
    assert {(5, 3, 9), (5, 4, 10)} <= found  # and the crossed "bugs" (5, 3, 10), (5, 4, 9)
    by_destination = get(client, "/api/head/L0H0/skip-trigrams", destination=3, k=2)["trigrams"]
    assert (by_destination[0]["source"]["id"], by_destination[0]["out"]["id"]) == (5, 9)
    assert by_destination[0]["source"]["str"] == "#5"  # no tokenizer: tokens read as ids
    assert [t["id"] for t in get(client, "/api/text", text="#5 3 4")["tokens"]] == [5, 3, 4]
    jobs.shutdown()


def test_skip_trigrams_are_the_brute_force_and_the_strongest(tmp_path):
    model = float64_model(n_layers=1, seed=5).requires_grad_(False)
    app, jobs = build_app(qkov.save(model, tmp_path / "one-layer"))  # float64 kept: exact answers
    client = TestClient(app, base_url="http://127.0.0.1")
    circuits = head_circuits(model, 0, 2)
    tokens, everything = circuits.tokens, strongest_skip_trigrams(circuits, k=23**3)
    strength = dense_strengths(model, 0, 2, tokens)
    for end, token in (("source", 4), ("source", 17), ("destination", 0), ("destination", 12)):
        shown = get(client, "/api/head/L0H2/skip-trigrams", k=6, **{end: token})["trigrams"]
        got = [(t["source"]["id"], t["destination"]["id"], t["out"]["id"]) for t in shown]
        want = brute_force(strength, tokens, 6, **{end: token})
        assert got == [w[:3] for w in want]
        assert [t["strength"] for t in shown] == pytest.approx([w[3] for w in want], rel=1e-12)
        assert got == [(t.source, t.destination, t.out) for t in everything if getattr(t, end) == token][:6]
    jobs.shutdown()
