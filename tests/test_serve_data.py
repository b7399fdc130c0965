"""The explorer on the user's own data (``qkov serve --tokens FILE [--targets FILE]``,
``serve/data.py`` and the data routes): every row's loss and accuracy, a row's patterns, per-position
loss, targets (``-100``: none) and predictions, and the path expansion against its target, checked
against the model's own forward in float64; a classifier's outputs read as classes, its typed text
without a loss; bad data refused in one line before the server starts."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from fastapi.testclient import TestClient

import qkov
from qkov.circuits.task import task_performance
from qkov.cli import main
from qkov.data.user_tokens import IGNORE, next_token_targets, read_user_tokens
from qkov.serve import build_app

from conftest import CLASSIFIER, classifier_data, random_model
from served import EVIL, ROWS, UNTARGETED, explorer_checkpoint, get, word_data

ABS = 1e-4  # the explorer serves the float32 checkpoint; the references are float64


@pytest.fixture(scope="module")
def data_served(tmp_path_factory):
    """The induction explorer with three rows of words (hostile ones among them) and next-token
    targets, two positions of row 1 without a target (-100); and the float64 model, tokens, targets."""
    folder = tmp_path_factory.mktemp("serve-data")
    checkpoint, _ = explorer_checkpoint(folder / "induction")
    model = qkov.load(checkpoint).requires_grad_(False)
    tokens, targets, _ = word_data(folder, model)
    assert torch.equal(targets[0], next_token_targets(tokens)[0])
    app, jobs = build_app(checkpoint, tokens=folder / "rows.npy", targets=folder / "targets.pt")
    with TestClient(app, base_url="http://127.0.0.1") as client:
        yield client, model.double(), tokens, targets
    jobs.shutdown()


@pytest.fixture(scope="module")
def classifier_served(tmp_path_factory):
    """A classifier (``d_vocab_out`` 2, labels at the last position only), served with its data."""
    folder = tmp_path_factory.mktemp("serve-classifier")
    model = random_model(CLASSIFIER, biases=True)
    tokens, targets = classifier_data(batch=5)
    qkov.save(model, folder / "ckpt")
    torch.save({"tokens": tokens}, folder / "x.pt")
    np.save(folder / "y.npy", targets.numpy())
    app, jobs = build_app(folder / "ckpt", tokens=folder / "x.pt", targets=folder / "y.npy")
    with TestClient(app, base_url="http://127.0.0.1") as client:
        yield client, qkov.load(folder / "ckpt").double().requires_grad_(False), tokens, targets, folder
    jobs.shutdown()


def dense_row(model, ids: torch.Tensor, targets: torch.Tensor) -> tuple[list, float, float]:
    """Per-position losses (None without a target), the row's mean loss and accuracy, float64."""
    logits = model(ids[None])[0].double()
    losses = [None if t == IGNORE else float(F.cross_entropy(logits[p], t)) for p, t in enumerate(targets)]
    has = targets != IGNORE
    right = logits[has].argmax(-1) == targets[has]
    return losses, float(F.cross_entropy(logits[has], targets[has])), float(right.double().mean())


def test_every_rows_loss_and_accuracy_are_the_models(data_served):
    client, model, tokens, targets = data_served
    described = get(client, "/api/model")["data"]
    assert described["description"] == "the user's tokens rows.npy (3 x 11 tokens; targets targets.pt)"
    assert described["rows"] == 3
    body = get(client, "/api/data", offset=0, limit=50)
    assert (body["rows"], body["length"], body["targeted"]) == (3, 11, 3 * 10 - 2)
    for r, listed in enumerate(body["listed"]):
        _, loss, accuracy = dense_row(model, tokens[r], targets[r])
        assert listed["row"] == r and listed["targeted"] == int((targets[r] != IGNORE).sum())
        assert listed["loss"] == pytest.approx(loss, rel=1e-5)
        assert listed["accuracy"] == pytest.approx(accuracy)
        assert [t["str"] for t in listed["tokens"]] == ROWS[r].split()[:8]  # hostile strings as data
    task = task_performance(model, tokens, targets, "rows")  # the numbers analyze --tokens reports
    assert body["loss"] == pytest.approx(task.loss, rel=1e-5)
    assert body["accuracy"] == pytest.approx(task.accuracy, abs=1e-12)
    assert [r["row"] for r in get(client, "/api/data", offset=1, limit=1)["listed"]] == [1]


def test_a_row_shows_patterns_targets_losses_and_predictions(data_served):
    client, model, tokens, targets = data_served
    body = get(client, "/api/data/row", row=1)
    assert body["row"] == 1 and [t["str"] for t in body["tokens"]] == ROWS[1].split()
    logits, cache = model.run_with_cache(tokens[1:2])
    for layer in range(2):
        for head in range(2):
            want = cache[f"blocks.{layer}.attn.hook_pattern"][0, head]
            for dest, row in enumerate(body["patterns"][f"L{layer}H{head}"]):
                assert row == pytest.approx(want[dest, : dest + 1].tolist(), abs=ABS)
    losses, loss, accuracy = dense_row(model, tokens[1], targets[1])
    assert [x is None for x in body["loss"]] == [
        p in (*UNTARGETED, 10) for p in range(11)
    ]  # -100, and the last
    dense = [x for x in losses if x is not None]
    assert [x for x in body["loss"] if x is not None] == pytest.approx(dense, abs=ABS)
    assert body["target"][3] is None and body["correct"][3] is None and body["target"][4]["str"] == EVIL[1]
    predicted = logits[0].argmax(-1)
    assert [p["id"] for p in body["prediction"]] == predicted.tolist()
    assert body["correct"][4] == (int(predicted[4]) == int(targets[1, 4]))
    assert body["mean_loss"] == pytest.approx(loss, rel=1e-5) and body["accuracy"] == pytest.approx(accuracy)
    # the induction head predicts the second "dog ran to"
    assert body["prediction"][9]["str"] == "to" and body["correct"][9] is True


def test_the_path_expansion_at_a_rows_position_sums_to_its_target_logit(data_served):
    client, model, tokens, targets = data_served
    body = get(client, "/api/data/paths", row=1, pos=9, k=3)
    logits = model(tokens[1:2])[0, 9]
    assert body["row"] == 1 and body["target"]["str"] == "to" and body["sorted_by"] == "target_logit"
    total = sum(t["target_logit"] for t in body["terms"])
    assert total == pytest.approx(float(logits[targets[1, 9]]), abs=ABS)
    assert body["terms"][0]["path"] == "L1H0"
    untargeted = get(client, "/api/data/paths", row=1, pos=3, k=3)  # -100: sorted by the prediction
    assert untargeted["target"] is None and untargeted["sorted_by"] == "predicted_logit"
    assert all(t["target_logit"] is None for t in untargeted["terms"])


@pytest.mark.parametrize(
    "url, params, message",
    [
        ("/api/data/row", {"row": 3}, "row 3 out of range: the data has rows 0 to 2"),
        ("/api/data/row", {"row": -1}, "row -1 out of range"),
        ("/api/data/paths", {"row": 0, "pos": 11}, "position 11 out of range"),
        ("/api/data", {"offset": 3}, "offset 3 out of range"),
        ("/api/data", {"limit": 201}, "limit=201 out of range: a page lists 1 to 200 rows"),
    ],
)
def test_bad_rows_get_a_400_with_a_message(data_served, url, params, message):
    client = data_served[0]
    response = client.get(url, params=params)
    assert response.status_code == 400 and message in response.json()["error"]


def test_without_data_the_data_view_says_how_to_give_it(served):
    client, _ = served
    assert get(client, "/api/model")["data"] is None
    response = client.get("/api/data/row", params={"row": 0})
    assert response.status_code == 400
    said = response.json()["error"]
    assert said == "no data was given: start the explorer with --tokens FILE [--targets FILE]"


def test_a_classifier_reads_classes_and_scores_its_labels(classifier_served):
    client, model, tokens, targets, _ = classifier_served
    described = get(client, "/api/model")
    assert described["d_out"] == 2 and "square token-to-token circuit" in described["square_reason"]
    body = get(client, "/api/data/row", row=2)
    logits = model(tokens[2:3])[0]
    assert [p["str"] for p in body["prediction"]] == [f"class {i}" for i in logits.argmax(-1).tolist()]
    label = int(targets[2, -1])
    assert body["loss"][:-1] == [None] * 6 and body["target"][-1] == {"id": label, "str": f"class {label}"}
    assert body["loss"][-1] == pytest.approx(float(F.cross_entropy(logits[-1], targets[2, -1])), abs=ABS)
    rows = get(client, "/api/data", offset=0, limit=5)
    task = task_performance(model, tokens, targets, "labels")
    assert rows["targeted"] == 5 and rows["loss"] == pytest.approx(task.loss, rel=1e-5)
    paths = get(client, "/api/data/paths", row=2, pos=6, k=2)
    total = sum(t["target_logit"] for t in paths["terms"])
    assert total == pytest.approx(float(logits[6, label]), abs=ABS)
    assert {t["str"] for t in paths["terms"][0]["top"]} == {"class 0", "class 1"}
    response = client.get("/api/heads")  # scores that need a square circuit: one line saying why
    assert response.status_code == 400 and "needs a square token-to-token circuit" in response.json()["error"]
    ov = get(client, "/api/head/L1H0/ov", token=3, k=2)
    assert {t["str"] for t in ov["raised"]} == {"class 0", "class 1"} and ov["own_rank"] is None


def test_a_classifiers_typed_text_has_predictions_and_no_loss(classifier_served):
    client, model, *_ = classifier_served
    body = get(client, "/api/text", text="1 2 3 4")
    logits = model(torch.tensor([[1, 2, 3, 4]]))[0]
    assert [p["str"] for p in body["prediction"]] == [f"class {i}" for i in logits.argmax(-1).tolist()]
    assert body["loss"] == [None] * 4 and body["mean_loss"] is None and body["accuracy"] is None
    assert body["no_loss"].startswith("no loss: the model's 2 outputs are classes (d_vocab_out), not next")
    paths = get(client, "/api/paths", text="1 2 3 4", pos=3, k=2)
    assert paths["target"] is None and paths["predicted"]["str"] == f"class {int(logits[3].argmax())}"
    total = sum(t["predicted_logit"] for t in paths["terms"])
    assert total == pytest.approx(float(logits[3].max()), abs=ABS)


def test_typed_text_starts_with_the_bos_token_where_the_config_has_one(tmp_path):
    import dataclasses

    from qkov.serve.explorer import Explorer

    folder, _ = explorer_checkpoint(tmp_path / "induction")
    plain = qkov.load(folder)
    words = plain.tokenizer.encode("cat sat").ids
    assert Explorer(plain, "no bos").tokens("cat sat") == words
    bos = qkov.load(folder)
    bos.cfg = dataclasses.replace(bos.cfg, bos_token_id=5)
    assert Explorer(bos, "bos").tokens("cat sat") == [5, *words]


def one_line_error(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("qkov: error: "), lines
    return lines[0]


def test_bad_data_is_refused_in_one_line_before_serving(classifier_served, tmp_path, capsys):
    *_, folder = classifier_served
    ckpt = str(folder / "ckpt")
    serve = ["serve", ckpt, "--port", "8123", "--threads", "1"]
    (tmp_path / "ragged.jsonl").write_text("[1, 2, 3]\n[1, 2]\n")
    np.save(tmp_path / "big.npy", np.full((2, 7), 9))
    np.save(tmp_path / "long.npy", np.zeros((2, 8), dtype=np.int64))
    np.save(tmp_path / "y_short.npy", np.zeros((5, 6), dtype=np.int64))
    np.save(tmp_path / "y_class.npy", np.full((5, 7), 2))
    y = ["--targets", str(folder / "y.npy")]
    cases = [
        (["--tokens", str(tmp_path / "ragged.jsonl"), *y], "ragged rows (lengths 2 to 3)"),
        (["--tokens", str(tmp_path / "big.npy"), *y], "token id 9 at row 0, position 0 is outside [0, 9)"),
        (["--tokens", str(tmp_path / "long.npy"), *y], "longer than the context (n_ctx=7)"),
        (["--tokens", str(tmp_path / "missing.npy"), *y], "missing.npy: no such file"),
        (["--tokens", str(folder / "x.pt"), "--targets", str(tmp_path / "y_short.npy")],
         "targets of shape (5, 6), tokens of (5, 7)"),
        (["--tokens", str(folder / "x.pt"), "--targets", str(tmp_path / "y_class.npy")],
         "target 2 at row 0, position 0 is outside [0, 2) or -100"),
        (["--tokens", str(folder / "x.pt")], "2 outputs are not tokens (d_vocab_out): give the targets"),
        (y, "--targets needs --tokens"),
    ]  # fmt: skip
    for extra, message in cases:
        assert message in one_line_error(capsys, serve + extra), message
    user = read_user_tokens(folder / "x.pt", folder / "y.npy", CLASSIFIER)  # the good pair loads
    assert user.targeted == 5
