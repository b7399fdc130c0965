"""The explorer's model (``serve/explorer.py``): folded once, read by every weight view, and its
vocabulary search."""

from __future__ import annotations

import importlib

import pytest
from fastapi.testclient import TestClient

import qkov
from qkov.serve.jobs import Jobs

from conftest import float64_model
from served import EVIL, get, layer_norm_model, layer_norm_read


def test_the_explorer_folds_layer_norm_once_and_every_weight_view_reads_it(tmp_path, monkeypatch):
    from qkov.serve.app import create_app
    from qkov.serve.explorer import Explorer

    fold = importlib.import_module("qkov.interop.fold")  # the module (qkov.interop.fold is also its function)

    model = layer_norm_model()
    ex = Explorer(qkov.load(qkov.save(model, tmp_path / "gpt2-style")), "gpt2-style")
    assert (ex.model.cfg.normalization, ex.circuit.cfg.normalization) == ("LN", "LNPre")
    folds, unfolded = [], fold.fold
    monkeypatch.setattr(fold, "fold", lambda m: folds.append(m.cfg.normalization) or unfolded(m))
    jobs = Jobs(cache_bytes=2**20)
    client = TestClient(create_app(ex, jobs), base_url="http://127.0.0.1")
    ov = get(client, "/api/head/L1H0/ov", token=3, k=4)
    get(client, "/api/head/L1H0/qk", token=3, k=4)
    get(client, "/api/head/L0H2/skip-trigrams", destination=3, k=4)
    get(client, "/api/pair", writer="L0H0", reader="L1H0", kind="V", k=4)
    get(client, "/api/paths", text="1 2 3", pos=2, k=4)
    jobs.shutdown()
    assert folds == []  # folded once, when the explorer was built
    attn = model.blocks[1].attn
    row = layer_norm_read(
        layer_norm_read(model.W_E[3], model.blocks[1].ln1) @ attn.W_V[0] @ attn.W_O[0], model.ln_final
    )
    row = row @ model.W_U
    assert [t["value"] for t in ov["raised"]] == pytest.approx(
        (row - row.mean()).topk(4).values.tolist(), abs=1e-12
    )
    plain = Explorer(float64_model(), "no layer norm")
    assert plain.circuit is plain.model  # nothing to fold: no copy


def test_vocabulary_search(served):
    client, _ = served
    assert [m["str"] for m in get(client, "/api/vocab", prefix="ca", k=5)["matches"]] == ["cat", "came"]
    assert get(client, "/api/vocab", prefix="#2", k=5)["matches"] == [{"id": 2, "str": EVIL[1]}]
    assert [m["str"] for m in get(client, "/api/vocab", prefix="</", k=5)["matches"]] == ["</script>"]
