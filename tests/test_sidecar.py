"""The sidecar: a model of 160 heads keeps every pair's composition scores and its induction checks
in results.arrays.safetensors, and load_results reads back exactly the results written; a small
model's results.json is written byte for byte as before, with no sidecar; a missing, damaged,
truncated or foreign sidecar, or a reference outside the folder, is refused in one line naming it."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import jsonschema
import pytest
import torch

from qkov.analyze import analyze
from qkov.config import Config
from qkov.errors import QkovError
from qkov.model import AttnOnlyTransformer
from qkov.results import SCHEMA_FILE, Reproduction, Results, load_results, to_json, write_results
from qkov.sidecar import SIDECAR_MIN_VALUES, join_arrays, split_arrays, write_sidecar

BIG_FIELDS = ("composition.Q", "composition.K", "composition.V", "induction_check")


def analysed(n_layers: int, n_heads: int) -> Results:
    torch.manual_seed(0)
    cfg = Config(n_layers=n_layers, n_heads=n_heads, d_model=32, d_head=8, d_vocab=64, n_ctx=16)
    return analyze(AttnOnlyTransformer(cfg), show_progress=False, steps=["composition", "induction_check"])


@pytest.fixture(scope="module")
def big() -> Results:
    return analysed(10, 16)  # 11,520 pairs of each kind


@pytest.fixture(scope="module")
def small() -> Results:
    return analysed(2, 4)  # 16 pairs of each kind


def references(data: dict) -> dict[str, dict]:
    c = data["composition"]
    return {"composition.Q": c["Q"], "composition.K": c["K"], "composition.V": c["V"]} | {
        "induction_check": data["induction_check"]
    }


def test_big_arrays_go_to_the_sidecar_and_come_back_exactly(big, tmp_path):
    file = write_results(big, tmp_path)
    data = json.loads(file.read_text())
    refs = references(data)
    assert {ref["key"] for ref in refs.values()} == set(BIG_FIELDS)
    assert all(ref["sidecar"] == "results.arrays.safetensors" for ref in refs.values())
    assert refs["composition.K"]["rows"] == len(big.composition.K) == 16 * 16 * 45
    assert (tmp_path / "results.arrays.safetensors").is_file()
    assert file.stat().st_size < len(to_json(big)) / 3
    jsonschema.validate(data, json.loads(SCHEMA_FILE.read_text()))  # the shipped schema allows them
    loaded = load_results(file)
    assert loaded == big and to_json(loaded) == to_json(big)
    scores = [(p.writer, p.reader, p.raw, p.score) for p in loaded.composition.V]
    assert scores == [(p.writer, p.reader, p.raw, p.score) for p in big.composition.V]


def test_a_reproduction_keeps_each_models_arrays_under_its_name(big, small, tmp_path):
    run = Reproduction(
        models={"big": big, "small": small}, claims=[], timings={}, total_s=0.0, quick=True, device="cpu",
        corpus="test",
    )  # fmt: skip
    file = write_results(run, tmp_path)
    data = json.loads(file.read_text())
    assert references(data["models"]["big"])["composition.K"]["key"] == "models.big.composition.K"
    assert isinstance(data["models"]["small"]["composition"]["K"], list)  # the small one stays inline
    assert load_results(file) == run


def test_a_small_model_is_written_as_before_and_removes_an_old_sidecar(big, small, tmp_path):
    write_results(big, tmp_path)
    file = write_results(small, tmp_path)
    assert file.read_text() == to_json(small)
    assert not (tmp_path / "results.arrays.safetensors").exists()
    assert load_results(file) == small


def refused(file: Path, *words: str) -> str:
    with pytest.raises(QkovError) as err:
        load_results(file)
    message = str(err.value)
    assert "\n" not in message and "results.arrays.safetensors" in message
    assert all(word in message for word in words), message
    return message


def test_a_missing_sidecar_is_one_line_naming_it(big, tmp_path):
    file = write_results(big, tmp_path)
    (tmp_path / "results.arrays.safetensors").unlink()
    refused(file, "missing", "composition.K")


def test_a_damaged_or_truncated_sidecar_is_one_line_naming_it(big, tmp_path):
    file = write_results(big, tmp_path)
    sidecar = tmp_path / "results.arrays.safetensors"
    whole = sidecar.read_bytes()
    sidecar.write_bytes(whole[:-100] + bytes(b ^ 0xFF for b in whole[-100:]))
    refused(file, "checksum")
    sidecar.write_bytes(whole[: len(whole) // 2])
    refused(file, "truncated or corrupt")


def test_another_runs_sidecar_is_refused(big, tmp_path):
    file = write_results(big, tmp_path / "a")
    c = big.composition  # another baseline in every K pair: a constant, so only the metadata differs
    other = dataclasses.replace(c, K=[dataclasses.replace(p, baseline=0.5) for p in c.K])
    changed = dataclasses.replace(big, composition=other)
    write_results(changed, tmp_path / "b")
    (tmp_path / "b" / "results.arrays.safetensors").replace(tmp_path / "a" / "results.arrays.safetensors")
    refused(file, "not the sidecar")


def test_a_reference_outside_the_folder_is_refused(big, tmp_path):
    file = write_results(big, tmp_path)
    data = json.loads(file.read_text())
    data["composition"]["K"]["sidecar"] = "../results.arrays.safetensors"
    file.write_text(json.dumps(data))
    with pytest.raises(QkovError, match="not one file beside"):
        load_results(file)


def test_columns_keep_nulls_integers_constants_and_mappings(tmp_path):
    rows = [
        {"head": f"L{i // 8}H{i % 8}", "n": i, "x": None if i % 3 else i / 7, "same": 0.25,
         "all": {"L0H0": 1.5, "L0H1": None} if i % 2 else {}}
        for i in range(SIDECAR_MIN_VALUES)
    ]  # fmt: skip
    data = {"induction_check": rows, "composition": None}
    original = json.loads(json.dumps(data))
    tensors, described = split_arrays(data, tmp_path / "results.json")
    kinds = {name: spec["kind"] for name, spec in described["induction_check"]["columns"].items()}
    assert kinds == {"head": "string", "n": "integer", "x": "number", "same": "constant", "all": "mapping"}
    write_sidecar(tmp_path / "results.json", tensors, described)
    join_arrays(data, tmp_path / "results.json")
    assert data == original
    assert all(type(a["n"]) is int for a in data["induction_check"])
    values = [v for row in data["induction_check"] for v in row.values()]
    assert not any(isinstance(v, float) and math.isnan(v) for v in values)
