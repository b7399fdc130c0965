"""The typed results: today's analysis gives the numbers schema version 2 held (field by field, on
five models), results.json round-trips through load_results, other schema versions and broken
files are refused with one line, and the shipped JSON Schema is the one the types generate."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from qkov.analyze import analyze
from qkov.config import NEW_ARCHITECTURE_FIELDS, Config
from qkov.errors import QkovError
from qkov.results import SCHEMA_FILE, Results, load_results, schema_text, to_json, write_results

from golden import cases

DATA = Path(__file__).parent / "data"


# Analyses added since version 2: their fields are dropped before comparing.
ADDED_SINCE_2 = (
    "induction_mechanism",
    "correction",
    "circuit",
    "neurons",
    "ablation_estimate",
    "rotary_bands",
    "gqa_groups",
    "circuit_notes",
    "steps",
)


def version_2_layout(new: dict) -> dict:
    """Today's results in the layout of schema version 2, the reference's: the copying score copied
    into every OV spectrum and beside each comparison, the direct measures beside each copying head,
    and the token strings beside every skip-trigram token; without what came since (the bug cost)."""
    old = json.loads(json.dumps(new)) | {"schema_version": 2}
    defaults = {f.name: f.default for f in dataclasses.fields(Config)}
    for key in NEW_ARCHITECTURE_FIELDS:  # the newer architectures' options, at their defaults
        assert old["config"].pop(key) == (
            list(defaults[key]) if isinstance(defaults[key], tuple) else defaults[key]
        )
    strings = new["tokens"]
    if new["copying"]:
        scores = [h["copying_score"] for h in new["copying"]["heads"]]
        direct = {d["name"]: d for d in new["copying_direct"]}
        for spectrum, score in zip(old["spectra"]["OV"], scores, strict=True):
            spectrum["copying_score"] = score
        for spectrum in old["spectra"]["QK"]:
            spectrum["copying_score"] = None
        for head in old["copying"]["heads"]:
            head |= {k: direct[head["name"]][k] for k in ("self_top1", "diagonal_z")}
        for row, score in zip(old["copying_comparison"], scores, strict=True):
            row |= {"copying_score": score} | {k: direct[row["name"]][k] for k in ("diagonal_z", "self_top1")}
    if new["skip_trigrams"]:
        del old["skip_trigrams"]["bug_cost"]  # added since version 2 (an optional field)
        for rows in old["skip_trigrams"]["tables"].values():
            for t in rows:
                t |= {f"{k}_str": strings[t[k]] for k in ("source", "destination", "out")}
        for bugs in old["skip_trigrams"]["bugs"].values():
            for bug in bugs:
                bug["source_str"] = strings[bug["source"]]
                bug["first_str"], bug["second_str"] = (
                    [strings[i] for i in bug[k]] for k in ("first", "second")
                )
                for c in bug["crossed"]:
                    c |= {"destination_str": strings[c["destination"]], "out_str": strings[c["out"]]}
    return without_later_keys(old)


def without_later_keys(old: dict) -> dict:
    """Drop what was added after version 2 and, at its default, says nothing the reference lacks:
    the output width and start token of the config, the user's task and example, the start
    position of the repeated-token test; ``skipped`` is dropped whatever it says (version 2 left
    out the steps that did not apply without a word), and so are the phase change's ``slope_of``
    (which loss its bump was read off) and the fields of analyses added since."""
    assert old.pop("task") is None
    old.pop("skipped")
    for key in ADDED_SINCE_2:
        old.pop(key)
    if old["phase_change"]:
        assert old["phase_change"].pop("slope_of") == "train_loss"
        # version 4: each test's verdict, the ICL score's noise and gains (no ICL score logged here)
        assert old["phase_change"].pop("verdict") == {True: "holds", False: "does not hold"}.get(
            old["phase_change"]["holds"], "undetermined"
        )
        assert set(old["phase_change"].pop("verdicts")) == {"induction_score", "icl_score", "loss_bump"}
        for key in ("icl_noise", "icl_gain", "icl_gain_error", "icl_total_gain"):
            assert old["phase_change"].pop(key) is None
    for row in old["training"]:  # version 4: the ICL score's standard error, not in these logs
        assert row.pop("icl_score_se") is None
    if old["repeated_tokens"]:  # version 4: standard errors over the sequences
        old["repeated_tokens"].pop("repeat_drop_se")
        for head in old["repeated_tokens"]["heads"]:
            head.pop("previous_token_score_se"), head.pop("induction_score_se")
    if old["composition"]:  # version 4: the random composition scores' spread
        assert old["composition"].pop("baseline_sd") > 0
        top, layers = old["composition"].pop("top"), old["composition"].pop("layers")  # added since
        for kind in ("Q", "K", "V"):  # the strongest pairs, and one strongest score per layer pair
            assert top[kind] == sorted(old["composition"][kind], key=lambda p: -p["score"])[: len(top[kind])]
            assert [row[1:] for row in layers[kind][:1]] == [[top[kind][0]["score"]]]
    for row in old["copying_direct"] or []:  # the diagonal over sampled tokens, added since
        assert [row.pop(key) for key in ("diagonal_rows", "diagonal_mean_se", "diagonal_z_se")] == [None] * 3
    for key in ("d_vocab_out", "bos_token_id"):
        assert old["config"].pop(key) is None
    if old["attention_examples"]:
        assert old["attention_examples"].pop("user") is None
    if old["repeated_tokens"]:
        assert old["repeated_tokens"].pop("bos_token_id") is None
    for effect in old["ablation"] or []:
        assert effect.pop("start") == 0
    if old["term_importance"]:  # each sequence's loss by order, for the standard errors
        by_sequence = np.array(old["term_importance"].pop("loss_by_order_by_sequence"))
        scored = np.array(old["term_importance"].pop("scored_by_sequence"))
        assert by_sequence @ scored / scored.sum() == pytest.approx(old["term_importance"]["loss_by_order"])
    return old


@pytest.fixture(scope="module")
def analysed() -> dict[str, Results]:
    return {
        name: analyze(model, corpus, log, show_progress=False, seed=0)
        for name, (model, corpus, log) in cases().items()
    }


# The references are results.json of schema version 2 as analyze wrote them from exactly these
# inputs; today's numbers must be theirs. Eigenvalues are written to 5 decimals, and version 2's OV
# spectra held a copying score from float32 eigenvalues where the one stored now is from float64.
FLOAT_TOLERANCE = 1e-6
ROUNDED = 1e-5
LOOSE = ("eigenvalues", "copying_score", ".term_importance.", ".ablation[")  # held to ROUNDED, below


def assert_same(new: object, old: object, where: str) -> None:
    if isinstance(old, dict):
        assert isinstance(new, dict) and set(new) == set(old), (where, set(new) ^ set(old))
        for key in old:
            assert_same(new[key], old[key], f"{where}.{key}")
    elif isinstance(old, list):
        assert isinstance(new, list) and len(new) == len(old), where
        for i, (a, b) in enumerate(zip(new, old, strict=True)):
            assert_same(a, b, f"{where}[{i}]")
    elif isinstance(old, float) and not isinstance(new, bool):
        # term importance: each first-order loss is now a logsumexp over column blocks summed in
        # float64, and each order's loss a sum over chunks of rows (the unembedding fused into
        # it), where the reference took one float32 mean of full logits; they differ by float32
        # rounding, up to ~2e-6 nats. The ablations: a layer's write is now one product over all
        # its heads, whose float32 rounding depends on how many rows it takes (the reruns stack
        # several ablations' batches, the clean run has one): up to ~8e-6 nats
        loose = any(part in where for part in LOOSE)
        assert new == pytest.approx(old, rel=FLOAT_TOLERANCE, abs=ROUNDED if loose else FLOAT_TOLERANCE), (
            where
        )
    else:
        assert new == old, where


def without_mean_ablations(results: dict) -> dict:
    """Version 2's "mean" ablation averaged a head's write over the batch and positions; today's
    averages over the batch at each position, as TransformerLens users do (the old one is
    "batch-mean"; both are tested against the dense computation in test_ablation.py): the
    zero ablations alone are compared."""
    if results["ablation"]:
        results["ablation"] = [e for e in results["ablation"] if e["mode"] == "zero"]
    return results


@pytest.mark.parametrize("name", list(cases()))
def test_the_numbers_are_those_of_schema_version_2(analysed, name):
    reference = without_mean_ablations(json.loads((DATA / f"results_{name}.json").read_text()))
    new = without_mean_ablations(version_2_layout(json.loads(to_json(analysed[name]))))
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
        (lambda d: d.pop("schema_version"), "schema_version None, but this qkov reads version 4"),
        (lambda d: d.update(schema_version=2), "schema_version 2, but this qkov reads version 4"),
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
