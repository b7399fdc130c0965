"""``qkov serve``: every endpoint against the library's own numbers (the same functions and the
same seeded batch analyze uses), bounds refused with a 4xx and a message, the bounded cache and
cancellable jobs, and hostile token strings and text served as data."""

from __future__ import annotations

import importlib
import time

import pytest
import torch
import torch.nn.functional as F
from fastapi.testclient import TestClient
from tokenizers import Tokenizer, models, pre_tokenizers

import qkov
from qkov.analyze import analyze
from qkov.circuits.skip_trigrams import head_circuits, strongest_skip_trigrams
from qkov.serve import build_app, is_loopback, serve
from qkov.serve.jobs import Jobs, LRUCache
from test_skip_trigrams_through import brute_force, dense_strengths

from conftest import float64_model, random_model, small_config
from handbuilt import induction_model, skip_trigram_model

EVIL = ["<script>alert(1)</script>", "<img/src=x/onerror=alert(1)>", "</script>"]
WORDS = [
    *("cat", "sat", "on", "the", "mat", ".", "dog", "ran", "to", "a", "park", "and", "then", "it"),
    *("came", "back", "home", ",", "big", "red", "blue", "green", "small"),
]
TEXT = "cat sat on the mat . dog ran cat sat on"


def word_tokenizer(words: list[str]) -> Tokenizer:
    """One token per whitespace-separated word (id 0 is the unknown word)."""
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tokenizer


def explorer_checkpoint(folder):
    """The hand-built induction model (L0H0 previous-token, L1H0 induction) with a vocabulary of
    words and hostile strings: a checkpoint folder whose right answers are known."""
    vocab = ["[UNK]", *EVIL, *WORDS]
    model = induction_model(d_vocab=len(vocab), n_ctx=24)
    return qkov.save(model, folder, word_tokenizer(vocab)), model


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder, model = explorer_checkpoint(tmp_path_factory.mktemp("serve") / "induction")
    app, jobs = build_app(folder)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        yield client, qkov.load(folder).requires_grad_(False)
    jobs.shutdown()


def get(client, url, **params):
    """GET, following a job (202) to its answer."""
    response = client.get(url, params=params)
    while response.status_code == 202:
        time.sleep(0.05)
        response = client.get(f"/api/jobs/{response.json()['job']}")
    assert response.status_code == 200, response.text
    return response.json()


def ids_of(model, text):
    return model.tokenizer.encode(text).ids


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
    loss = F.cross_entropy(logits[0, :-1], torch.tensor(ids[1:]), reduction="none")
    assert body["loss"][0] is None
    assert body["loss"][1:] == pytest.approx(loss.tolist(), abs=1e-4)
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
    spectra = {s.name: s for s in qkov.head_spectra(model, "OV", k=10)}
    assert [h["singular_values"] for h in body["heads"]] == [
        list(spectra[h["name"]].singular_values) for h in body["heads"]
    ]
    scores = {h["name"]: h for h in body["heads"]}
    assert scores["L0H0"]["previous_token_score"] > 0.99
    assert max(scores.values(), key=lambda h: h["induction_score"])["name"] == "L1H0"


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


def layer_norm_model() -> qkov.AttnOnlyTransformer:
    """A GPT-2-style model as ``qkov import --no-fold`` keeps one: LayerNorm unfolded
    (``normalization="LN"``), its weight near 1 and its bias drawn (folding them is not trivial),
    biases everywhere, float64 so that the dense reference is exact."""
    model = random_model(
        small_config(positional_embedding="standard", normalization="LN"), seed=7, biases=True
    )
    gen = torch.Generator().manual_seed(8)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".w"):
                param.copy_(1.0 + 0.3 * torch.randn(param.shape, generator=gen))
    return model.double().requires_grad_(False)


def layer_norm_read(x: torch.Tensor, ln) -> torch.Tensor:
    """What a weight after LayerNorm reads of ``x`` (the linear part, per unit scale): ``x``
    centred over ``d_model``, times LayerNorm's weight (its bias and scale reach no circuit)."""
    return (x - x.mean(-1, keepdim=True)) * ln.w


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


@pytest.mark.parametrize(
    "url, params, message",
    [
        ("/api/text", {"text": " ".join(["cat"] * 25)}, "longer than the context (n_ctx=24)"),
        ("/api/text", {"text": "x" * 4001}, "longer than the limit of 4000"),
        ("/api/text", {"text": "   "}, "the text has no tokens"),
        ("/api/head/L2H0/ov", {"token": 4}, "no head L2H0"),
        ("/api/head/L0H7/qk", {"token": 4}, "no head L0H7"),
        ("/api/head/../../etc/ov", {"token": 4}, "Not Found"),
        ("/api/head/L1H0/ov", {"token": -1}, "token id -1 out of range"),
        ("/api/head/L1H0/qk", {"token": 10**6}, "token id 1000000 out of range"),
        ("/api/head/L1H0/ov", {"token": 4, "k": 10**6}, "k=1000000 out of range"),
        ("/api/head/L1H0/ov", {"token": 4, "k": 0}, "k=0 out of range"),
        ("/api/head/L1H0/ov", {"token": "cat"}, "token: Input should be a valid integer"),
        ("/api/paths", {"text": TEXT, "pos": 11}, "position 11 out of range"),
        (
            "/api/head/L0H0/skip-trigrams",
            {"source": 4, "destination": 5},
            "exactly one of source and destination",
        ),
        ("/api/pair", {"writer": "L1H0", "reader": "L0H0"}, "must be in an earlier layer"),
        (
            "/api/pair",
            {"writer": "L0H0", "reader": "L1H0", "kind": "X"},
            "kind: Input should be 'Q', 'K' or 'V'",
        ),
        ("/api/pair", {"writer": "L0H0"}, "reader: Field required"),
        ("/api/jobs/999999", {}, "no job '999999'"),
        ("/static/config.json", {}, "no asset 'config.json'"),
        ("/static/..%2Fconfig.json", {}, "Not Found"),
    ],
)
def test_bad_input_gets_a_4xx_with_a_message(served, url, params, message):
    client, _ = served
    response = client.get(url, params=params)
    assert 400 <= response.status_code < 500
    assert message in response.json()["error"]
    assert client.get("/api/model").status_code == 200  # and the server keeps serving


def test_only_its_own_assets_and_safe_headers(served):
    client, _ = served
    page = client.get("/")
    assert page.status_code == 200 and "script-src 'self'" in page.headers["content-security-policy"]
    assert page.headers["x-content-type-options"] == "nosniff"
    assert "http" not in page.text.replace("http://www.w3.org", "")  # nothing fetched from elsewhere
    assert "innerHTML" not in client.get("/static/app.js").text  # data goes in as text, never as HTML
    assert client.get("/api/model", headers={"host": "attacker.example"}).status_code == 400  # DNS rebinding
    assert client.get("/openapi.json").json()["paths"]["/api/head/{name}/ov"]["get"]["summary"]
    assert client.get("/docs").status_code == 404  # the interactive docs would load a CDN


def test_hostile_strings_travel_as_json_data(served):
    client, model = served
    text = f"cat {EVIL[0]} sat {EVIL[1]} on {EVIL[2]}"
    body = get(client, "/api/text", text=text)
    assert [t["str"] for t in body["tokens"]] == text.split()


def test_the_cache_is_bounded_and_least_recently_used_goes_first():
    cache = LRUCache(max_bytes=10)
    cache.put("a", b"1234")
    cache.put("b", b"5678")
    assert cache.get("a") == b"1234"  # now b is the least recently used
    cache.put("c", b"90ab")
    assert cache.get("b") is None and cache.get("a") == b"1234" and cache.bytes == 8
    cache.put("huge", b"x" * 11)  # larger than the whole cache: not kept
    assert cache.get("huge") is None and len(cache) == 2


def test_a_long_computation_reports_progress_and_can_be_cancelled():
    jobs = Jobs(cache_bytes=2**20, workers=1, wait_s=0.05)
    started = []

    def slow(progress):
        for i in range(1000):
            progress.step(i, 1000, "counting")
            started.append(i)
            time.sleep(0.01)
        return {"done": True}

    status, body = jobs.answer(("slow",), slow)
    assert status == 202
    job_id = __import__("json").loads(body)["job"]
    time.sleep(0.2)
    state, answer = jobs.status(job_id)
    assert (
        state["state"] == "running" and state["done"] > 0 and state["stage"] == "counting" and answer is None
    )
    assert jobs.cancel(job_id)["state"] == "cancelled"
    time.sleep(0.1)
    seen = len(started)
    time.sleep(0.1)
    assert len(started) == seen < 1000  # it stopped
    status, _ = jobs.answer(("fast",), lambda progress: [1, 2])
    assert status == 200 and jobs.answer(("fast",), lambda progress: 1 / 0) == (200, b"[1,2]")  # cached
    jobs.shutdown()


def test_a_non_loopback_host_is_warned_about(capsys, tmp_path):
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.2")
    with pytest.raises(qkov.QkovError, match="no such checkpoint folder"):
        serve(tmp_path / "missing", "0.0.0.0", 8000, 16, 1)
    assert "warning: serving on 0.0.0.0, reachable from other machines" in capsys.readouterr().err


def test_a_path_expansion_too_large_for_memory_is_refused(served, monkeypatch):
    from qkov.serve import text

    client, _ = served
    monkeypatch.setattr(text, "MAX_PATH_BYTES", 9 * 3 * 27 * 4 - 1)  # 9 paths x 3 positions x d_vocab 27
    response = client.get("/api/paths", params={"text": TEXT, "pos": 2, "k": 3})
    assert response.status_code == 400 and "choose an earlier position" in response.json()["error"]
    assert get(client, "/api/paths", text=TEXT, pos=1, k=3)["position"] == 1


def test_the_command_line_refuses_a_missing_checkpoint_in_one_line(tmp_path, capsys):
    from qkov.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["serve", str(tmp_path / "missing"), "--port", "8123"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"qkov: error: {tmp_path / 'missing'}: no such checkpoint folder"
    ]
    with pytest.raises(SystemExit):
        main(["serve", str(tmp_path), "--port", "70000"])
    assert "--port must lie in [1, 65535], got 70000" in capsys.readouterr().err


def test_stats_show_the_cache_within_its_limit(served):
    client, _ = served
    get(client, "/api/vocab", prefix="d", k=3)
    stats = get(client, "/api/stats")
    assert stats["cache_entries"] >= 1 and 0 < stats["cache_bytes"] <= stats["cache_max_bytes"] == 256 * 2**20


def test_a_job_is_polled_and_cancelled_through_the_app(tmp_path):
    from qkov.serve.app import create_app
    from qkov.serve.explorer import Explorer

    folder, _ = explorer_checkpoint(tmp_path / "induction")
    jobs = Jobs(cache_bytes=2**20, workers=1, wait_s=0.0)  # every computation answers 202 first
    client = TestClient(create_app(Explorer(qkov.load(folder), "induction"), jobs))
    started = client.get("/api/heads")
    assert started.status_code == 202 and started.json()["state"] == "running"
    job = started.json()["job"]
    assert client.delete(f"/api/jobs/{job}").json()["state"] == "cancelled"
    polled = client.get(f"/api/jobs/{job}")
    assert polled.status_code == 409 and polled.json() == {"error": "the computation was cancelled"}
    answer = get(client, "/api/text", text=TEXT)  # a later query is computed as a job and polled
    assert len(answer["tokens"]) == len(TEXT.split())
    jobs.shutdown()
