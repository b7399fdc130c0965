"""The typed results: today's analysis gives the numbers the untyped version gave (field by field,
on four models), results.json round-trips through load_results, other schema versions and broken
files are refused with one line, and the shipped JSON Schema is the one the types generate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qkov.analyze import analyze
from qkov.errors import QkovError
from qkov.results import SCHEMA_FILE, Results, load_results, schema_text, to_json, write_results

from golden import cases

DATA = Path(__file__).parent / "data"


def old_layout(new: dict) -> dict:
    """The typed results, rearranged into the untyped layout of the reference files."""
    heads = [
        {k: v for k, v in c.items() if k not in ("eigenvalues", "copies")} | b
        for c, b in zip(new["copying"]["heads"] if new["copying"] else [], _heads(new), strict=True)
    ]
    old = {k: new[k] for k in ("config", "tokens")} | {"heads": heads}
    old["training"] = [{k: v for k, v in row.items() if k not in ADDED_TRAINING} for row in new["training"]]
    old |= {k: new[k] for k in ("bigram", "qk_position_content", "term_importance") if new[k]}
    if new["ablation"]:  # each ablation's batch (the reference's: the repeated batch) was added since
        batch = ("sequences", "period")
        old["ablation"] = [{k: v for k, v in e.items() if k not in batch} for e in new["ablation"]]
    if new["copying"]:
        c = new["copying"]
        old["copying"] = {k: c[k] for k in ("baseline_mean", "threshold", "baseline", "copying_heads")}
        old["copying"]["eigenvalues"] = {h["name"]: h["eigenvalues"] for h in c["heads"]}
    if new["repeated_tokens"]:
        t = new["repeated_tokens"]
        old["in_context_loss"] = {"repeats": t["loss_per_repeat"], "period": t["period"]}
        old["in_context_loss"]["sequences"] = t["sequences"]
        examples = new["attention_examples"]
        old["attention_examples"] = {
            key: {"tokens": e["tokens"], "patterns": e["patterns"]} for key, e in examples.items() if e
        }
    if new["qk_position_content"] is None and new["copying"]:
        old["qk_position_content"] = None
    if new["skip_trigrams"]:
        old["skip_trigrams"] = new["skip_trigrams"]["tables"]
        old["skip_trigram_bugs"] = new["skip_trigrams"]["bugs"]
    if new["composition"]:
        rename = {"writer": "from", "reader": "to"}
        old["composition"] = {
            kind: [{rename.get(k, k): v for k, v in pair.items()} for pair in new["composition"][kind]]
            for kind in "QKV"
        }
        old["induction_check"] = [
            {("with" if k == "writer" else k): v for k, v in row.items()} for row in new["induction_check"]
        ]
    return old


def _heads(new: dict) -> list[dict]:
    if not new["repeated_tokens"]:
        return []
    return [
        {k: v for k, v in h.items() if k not in ("name", "layer", "head")}
        for h in new["repeated_tokens"]["heads"]
    ]


@pytest.fixture(scope="module")
def analysed() -> dict[str, Results]:
    return {
        name: analyze(model, corpus, log, show_progress=False, seed=0)
        for name, (model, corpus, log) in cases().items()
    }


# Since the reference was written, the copying measures moved to circuits/copying.py: eigenvalues
# from float64 cores of float64 factors (before: float64 eigenvalues of float32 products) and the
# diagonal statistics streamed in the weights' float32, so copying numbers agree to float32
# precision, not bit for bit; and self_top1 counts a token only when its own logit is its row's
# strict maximum, so a head whose rows are constant no longer "copies" the token that sorts first.
ADDED_CONFIG = {"normalization": "none", "d_mlp": 0, "act_fn": "gelu_new", "ln_eps": 1e-5, "source": "qkov"}
# Since then the training log gained the in-context-learning fields (null in these logs), and the
# phase change was redefined by Olsson et al.'s signatures in log tokens (issue 13): the reference's
# phase_change is of the old rule, and test_phase_change.py checks the new one against known answers.
ADDED_TRAINING = {"icl_score": None, "loss_by_position": None}
FLOAT_TOLERANCE = 1e-6
ROUNDED = 1e-5  # eigenvalues are written to 5 decimals: a float32 difference can flip the last one
KNOWN_CHANGES = {  # (now, before): heads whose rows are all zero but one (1-layer) or all zero
    ("1-layer", "L0H0", "self_top1"): (0.0, 1 / 16),
    ("2-layer-induction", "L0H0", "self_top1"): (0.0, 1 / 64),
}


def assert_same(new: object, old: object, where: str) -> None:
    if isinstance(old, dict):
        assert isinstance(new, dict) and set(new) == set(old), where
        for key in old:
            assert_same(new[key], old[key], f"{where}.{key}")
    elif isinstance(old, list):
        assert isinstance(new, list) and len(new) == len(old), where
        for i, (a, b) in enumerate(zip(new, old, strict=True)):
            assert_same(a, b, f"{where}[{i}]")
    elif isinstance(old, float) and not isinstance(new, bool):
        assert new == pytest.approx(
            old, rel=FLOAT_TOLERANCE, abs=ROUNDED if "eigenvalues" in where else FLOAT_TOLERANCE
        ), where
    else:
        assert new == old, where


@pytest.mark.parametrize("name", list(cases()))
def test_the_numbers_are_the_untyped_versions(analysed, name):
    reference = json.loads((DATA / f"results_{name}.json").read_text())
    reference.pop("phase_change")
    typed = json.loads(to_json(analysed[name]))
    assert all({k: row[k] for k in ADDED_TRAINING} == ADDED_TRAINING for row in typed["training"])
    new = old_layout(typed)
    added = {k: new["config"].pop(k) for k in list(new["config"]) if k not in reference["config"]}
    assert added == ADDED_CONFIG  # GPT-2-style options since: their attention-only defaults
    for head_new, head_old in zip(new["heads"], reference["heads"], strict=True):
        for field in list(head_old):
            change = KNOWN_CHANGES.get((name, head_old["name"], field))
            if change is not None:
                assert (head_new[field], head_old[field]) == pytest.approx(change)
                head_new[field] = head_old[field]
    assert_same(new, reference, name)


def test_results_round_trip_through_the_file(analysed, tmp_path):
    for name, results in analysed.items():
        folder = tmp_path / name
        folder.mkdir()
        loaded = load_results(write_results(results, folder))
        assert isinstance(loaded, Results)
        assert to_json(loaded) == to_json(results)
    two = load_results(tmp_path / "2-layer-induction" / "results.json")
    assert two.composition.K[0].writer == "L0H0" and two.repeated_tokens.induction_heads == ["L1H0"]


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d.pop("schema_version"), "schema_version None, but this qkov reads version 2"),
        (lambda d: d.update(schema_version=1), "schema_version 1, but this qkov reads version 2"),
        (lambda d: d["copying"].update(copying_heads="many"), "copying.copying_heads"),
        (lambda d: d.pop("tokens"), "tokens: Field required"),
    ],
)
def test_a_file_of_another_version_or_shape_is_refused_with_one_line(analysed, tmp_path, edit, message):
    data = json.loads(to_json(analysed["2-layer-induction"]))
    edit(data)
    file = tmp_path / "results.json"
    file.write_text(json.dumps(data))
    with pytest.raises(QkovError, match="results.json: ") as err:
        load_results(file)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_an_unreadable_file_is_one_line(tmp_path):
    with pytest.raises(QkovError, match="cannot read results"):
        load_results(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(QkovError, match="cannot read results"):
        load_results(tmp_path / "bad.json")


def test_the_shipped_schema_is_generated_from_the_types():
    regenerate = "regenerate it: qkov schema > src/qkov/schema/results.schema.json"
    assert SCHEMA_FILE.read_text() == schema_text(), regenerate
    schema = json.loads(SCHEMA_FILE.read_text())
    assert {"Results", "Reproduction", "Claim", "Composition"} <= set(schema["$defs"])
