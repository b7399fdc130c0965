"""`qkov reproduce --quick` end to end on a tiny corpus: every code path, the results' shape, reuse
of finished runs, and claims whose verdict follows the measurement."""

from __future__ import annotations

import pytest

from qkov.cli import main
from qkov.results import Reproduction, load_results

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
    results = load_results(out / "results.json")
    assert isinstance(results, Reproduction) and results.quick
    assert set(results.models) == {"0-layer", "1-layer", "2-layer"}
    assert results.models["0-layer"].bigram is not None
    assert results.models["1-layer"].skip_trigrams.tables
    assert results.models["2-layer"].composition.K
    assert len(results.claims) == 9 and all(c.rule for c in results.claims)
    # the tiny models decide nothing against a claim: a rule they fail is undetermined, and says why
    assert all(c.verdict in ("holds", "undetermined") for c in results.claims)
    assert any("--quick: the models are too small to decide" in c.note for c in results.claims)
    assert set(results.timings) == {"0-layer", "1-layer", "2-layer"} and results.total_s > 0
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
    printed = capsys.readouterr().out.splitlines()
    claims = load_results(out / "results.json").claims  # the rerun's, rewritten from the same models
    table = printed[printed.index(next(line for line in printed if line.startswith("claim "))) :][1:10]
    assert [line.endswith(f"  {c.verdict}") for line, c in zip(table, claims, strict=True)] == [True] * 9
    assert any(line.startswith("Claims: ") for line in printed)
    assert [line[: len(c.claim)] for line, c in zip(table, claims, strict=True)] == [c.claim for c in claims]
    assert printed[-1].endswith(f"wrote {out / 'results.json'} and {out / 'report.html'}")


def test_a_folder_trained_with_other_settings_is_an_error_not_resumed(quick_run, capsys):
    out, corpus = quick_run
    with pytest.raises(SystemExit) as exit_info:
        main(["reproduce", "--out", str(out), "--corpus", str(corpus), "--quiet"])  # not --quick
    assert exit_info.value.code == 2
    assert "qkov: error: --d-model 128 contradicts the run being resumed (32)\n" in capsys.readouterr().err
