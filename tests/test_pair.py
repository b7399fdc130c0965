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
