"""The explorer's pair view (``serve/pair.py``): analyze's composition and induction check, and an
unfolded LayerNorm model's virtual weights and token ends against a dense float64 reference."""

from __future__ import annotations

import pytest
import torch
from fastapi.testclient import TestClient

import qkov
from qkov.analyze import analyze
from qkov.serve import build_app

from served import get, layer_norm_model, layer_norm_read


def test_pair_is_analyzes_composition_and_induction_check(served):
    client, model = served
    results = analyze(model, show_progress=False)
    body = get(client, "/api/pair", writer="L0H0", reader="L1H0", kind="K", k=3)
    for kind in "QKV":
        row = next(r for r in getattr(results.composition, kind) if (r.writer, r.reader) == ("L0H0", "L1H0"))
        assert body["composition"][kind]["raw"] == pytest.approx(row.raw, abs=1e-12)
        assert body["composition"][kind]["score"] == pytest.approx(row.score, abs=1e-12)
    check = next(r for r in results.induction_check if r.head == "L1H0")
    assert body["k_composition_positivity"] == check.all["L0H0"]
    assert body["k_composition_positivity"] > 0.99
    dense = (model.blocks[0].attn.W_O[0] @ model.blocks[1].attn.W_K[0]).double()
    assert body["virtual_weight"]["singular_values"] == pytest.approx(
        torch.linalg.svdvals(dense).tolist(), abs=1e-4
    )


def top_and_bottom(values: torch.Tensor, k: int) -> list[float]:
    return values.topk(k).values.tolist() + values.topk(k, largest=False).values.tolist()


def shown_ends(end: dict) -> list[float]:
    return [t["value"] for t in end["positive"]] + [t["value"] for t in end["negative"]]


@pytest.mark.parametrize("kind", ["Q", "K", "V"])
def test_pair_view_of_an_unfolded_layer_norm_model_is_the_dense_reference(tmp_path, kind):
    model = layer_norm_model()
    app, jobs = build_app(qkov.save(model, tmp_path / "gpt2-style"))
    body = get(
        TestClient(app, base_url="http://127.0.0.1"),
        "/api/pair",
        writer="L0H1",
        reader="L1H2",
        kind=kind,
        k=5,
    )
    jobs.shutdown()
    a1, a2, ln0, ln1 = model.blocks[0].attn, model.blocks[1].attn, model.blocks[0].ln1, model.blocks[1].ln1
    U, S, Vh = torch.linalg.svd(layer_norm_read(a1.W_O[1], ln1) @ getattr(a2, f"W_{kind}")[2])
    assert body["virtual_weight"]["singular_values"] == pytest.approx(S.tolist(), abs=1e-12)
    values = layer_norm_read(model.W_E, ln0) @ a1.W_V[1]  # [d_vocab, d_head]: each token's value
    for i, direction in enumerate(body["virtual_weight"]["directions"]):
        if kind == "V":  # the logits the direction writes, centred over the vocabulary (as folded)
            reads = layer_norm_read(Vh[i] @ a2.W_O[2], model.ln_final) @ model.W_U
            reads = reads - reads.mean()
        else:  # the queries (keys) of every token, along the direction
            reads = layer_norm_read(model.W_E, ln1) @ getattr(a2, {"K": "W_Q", "Q": "W_K"}[kind])[2] @ Vh[i]
        shown = shown_ends(direction["writer"]) + shown_ends(direction["reader"])
        assert any(  # singular vectors are defined up to one sign, shared by u and v
            shown
            == pytest.approx(
                top_and_bottom(sign * values @ U[:, i], 5) + top_and_bottom(sign * reads, 5), abs=1e-12
            )
            for sign in (1.0, -1.0)
        ), (kind, i)


def test_pairs_are_analyzes_strongest_first_filtered_and_paged(served):
    client, model = served
    results = analyze(model, show_progress=False, steps=["composition"])
    body = get(client, "/api/pairs", kind="V", limit=5)
    assert body["total"] == len(results.composition.V)
    assert [(p["writer"], p["reader"]) for p in body["pairs"]] == [
        (p.writer, p.reader) for p in results.composition.top["V"][:5]
    ]
    assert [p["score"] for p in body["pairs"]] == pytest.approx(
        [p.score for p in results.composition.top["V"][:5]], abs=1e-12
    )
    every = get(client, "/api/pairs", kind="K", writer_layer=0, reader_layer=1, limit=100)["pairs"]
    page = get(client, "/api/pairs", kind="K", writer_layer=0, reader_layer=1, offset=2, limit=3)
    assert page["pairs"] == every[2:5] and page["total"] == model.cfg.n_heads**2 == len(every)
    assert all(a["score"] >= b["score"] for a, b in zip(every, every[1:], strict=False))
    assert get(client, "/api/pairs", kind="Q", writer_layer=1)["total"] == 0  # nothing after the last layer
    for params, message in (
        ({"reader_layer": 2}, "reader_layer=2 out of range: the model has layers 0 to 1"),
        ({"offset": -1}, "offset=-1, limit=20: a page starts at 0"),
        ({"limit": 101}, "holds 1 to 100"),
    ):
        response = client.get("/api/pairs", params=params)
        assert 400 <= response.status_code < 500 and message in response.json()["error"]
