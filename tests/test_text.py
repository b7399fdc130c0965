"""The explorer's text view (``serve/text.py``): every head's pattern and the loss are the model's, and
the path expansion's terms sum to the logits (a too large one is refused)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from served import TEXT, get, ids_of


def test_text_patterns_and_loss_are_the_models(served):
    client, model = served
    body = get(client, "/api/text", text=TEXT)
    ids = ids_of(model, TEXT)
    assert [t["id"] for t in body["tokens"]] == ids
    assert [t["str"] for t in body["tokens"]] == TEXT.split()
    logits, cache = model.run_with_cache(torch.tensor([ids]))
    for layer in range(2):
        for head in range(2):
            want = cache[f"blocks.{layer}.attn.hook_pattern"][0, head]
            got = body["patterns"][f"L{layer}H{head}"]
            for dest, row in enumerate(got):
                assert row == pytest.approx(want[dest, : dest + 1].tolist(), abs=1e-4)
    # each position's prediction scored against its target, the next token (the last has none)
    loss = F.cross_entropy(logits[0, :-1].double(), torch.tensor(ids[1:]), reduction="none")
    assert body["loss"][-1] is None and body["target"][-1] is None and body["correct"][-1] is None
    assert body["loss"][:-1] == pytest.approx(loss.tolist(), abs=1e-4)
    assert [t["id"] for t in body["target"][:-1]] == ids[1:]
    predicted = logits[0].argmax(-1)
    assert body["correct"][:-1] == (predicted[:-1] == torch.tensor(ids[1:])).tolist()
    assert body["mean_loss"] == pytest.approx(float(loss.mean()), rel=1e-6)
    assert body["accuracy"] == pytest.approx(float((predicted[:-1] == torch.tensor(ids[1:])).double().mean()))
    assert body["no_loss"] is None
    # the planted heads: L0H0 attends to the previous token; L1H0 predicts "sat" after the second "cat"
    assert all(row[dest - 1] > 0.99 for dest, row in enumerate(body["patterns"]["L0H0"]) if dest)
    assert body["prediction"][8]["str"] == "sat"


def test_path_expansion_terms_sum_to_the_logits(served):
    client, model = served
    ids = ids_of(model, TEXT)
    body = get(client, "/api/paths", text=TEXT, pos=8, k=3)
    logits = model(torch.tensor([ids]))[0, 8]
    assert body["predicted"]["str"] == "sat" and body["target"]["str"] == "sat"
    assert sum(t["target_logit"] for t in body["terms"]) == pytest.approx(float(logits[ids[9]]), abs=1e-3)
    assert len(body["terms"]) == 3**2  # (n_heads + 1) ** n_layers paths
    assert body["terms"][0]["path"] == "L1H0"  # the induction head writes the prediction
    direct = next(t for t in body["terms"] if t["path"] == "direct")
    want = ((model.W_E[ids[8]] + model.W_pos[8]) @ model.W_U).topk(3)  # the direct path (standard positions)
    assert [t["value"] for t in direct["top"]] == pytest.approx(want.values.tolist(), abs=1e-4)


def test_a_path_expansion_too_large_for_memory_is_refused(served, monkeypatch):
    from qkov.serve import text

    client, _ = served
    monkeypatch.setattr(text, "MAX_PATH_BYTES", 9 * 3 * 27 * 4 - 1)  # 9 paths x 3 positions x d_vocab 27
    response = client.get("/api/paths", params={"text": TEXT, "pos": 2, "k": 3})
    assert response.status_code == 400 and "choose an earlier position" in response.json()["error"]
    assert get(client, "/api/paths", text=TEXT, pos=1, k=3)["position"] == 1
