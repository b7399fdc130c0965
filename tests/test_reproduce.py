"""`qkov reproduce --quick` end to end on a tiny corpus: every code path, the results' shape, reuse
of finished runs, and claims whose verdict follows the measurement."""

from __future__ import annotations

import copy
import json

import pytest

from qkov.cli import main
from qkov.reproduce import evaluate_claims

from conftest import write_tiny_corpus


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("reproduce")
    corpus = write_tiny_corpus(root / "corpus", functions=60)
    out = root / "out"
    main(["reproduce", "--quick", "--out", str(out), "--corpus", str(corpus), "--quiet"])
    return out, corpus


def test_quick_reproduce_writes_results_and_report(quick_run, capsys):
    out, _ = quick_run
    results = json.loads((out / "results.json").read_text())
    assert set(results["models"]) == {"0-layer", "1-layer", "2-layer"}
    assert "bigram" in results["models"]["0-layer"]
    assert results["models"]["1-layer"]["skip_trigrams"]
    assert results["models"]["2-layer"]["composition"]["K"]
    assert len(results["claims"]) >= 9
    for claim in results["claims"]:
        assert set(claim) == {"claim", "paper", "measured", "holds"} and isinstance(claim["holds"], bool)
    for depth in ("0-layer", "1-layer", "2-layer"):
        assert (out / depth / "model.safetensors").is_file() and (out / depth / "metrics.jsonl").is_file()
    html = (out / "report.html").read_text()
    assert "Claims:" in html and "2-layer model" in html


def test_rerunning_reuses_the_finished_models(quick_run, capsys):
    out, corpus = quick_run
    depths = ("0-layer", "1-layer", "2-layer")
    before = {d: (out / d / "model.safetensors").stat().st_mtime_ns for d in depths}
    main(["reproduce", "--quick", "--out", str(out), "--corpus", str(corpus), "--quiet"])
    after = {d: (out / d / "model.safetensors").stat().st_mtime_ns for d in before}
    assert after == before
    printed = capsys.readouterr().out
    assert "holds" in printed and "wrote" in printed


def test_claims_follow_the_measurements(quick_run):
    out, _ = quick_run
    models = json.loads((out / "results.json").read_text())["models"]
    models = copy.deepcopy(models)
    models["0-layer"]["bigram"]["correlation"] = 0.9
    assert evaluate_claims(models)[0]["holds"] is True
    models["0-layer"]["bigram"]["correlation"] = 0.1
    assert evaluate_claims(models)[0]["holds"] is False
    models["2-layer"]["in_context_loss"]["repeats"] = [8.0, 2.0, 1.5]
    drop = next(c for c in evaluate_claims(models) if c["claim"].startswith("Loss on repeated"))
    assert drop["holds"] is True and "8.00 / 2.00 / 1.50" in drop["measured"]
    models["2-layer"]["in_context_loss"]["repeats"] = [8.0, 7.9, 7.9]
    drop = next(c for c in evaluate_claims(models) if c["claim"].startswith("Loss on repeated"))
    assert drop["holds"] is False
