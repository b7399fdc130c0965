"""Reading another library's model (``qkov.interop.source``): which file holds the weights, which
config goes with them, the tensors of a safetensors file or a pickled state dict alike, and one line
for each thing that can be missing or wrong."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

import qkov
from qkov.interop.source import check_finite, config_file, read_config_file, read_source, weights_file

TENSORS = {"a.weight": torch.arange(6.0).reshape(2, 3), "b.bias": torch.tensor([1.5, -2.0])}


def source_folder(folder, weights="model.safetensors", tokenizer=False):
    folder.mkdir()
    if weights.endswith(".safetensors"):
        save_file(TENSORS, folder / weights)
    else:
        torch.save(TENSORS, folder / weights)
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    if tokenizer:
        (folder / "tokenizer.json").write_text("{}")
    return folder


@pytest.mark.parametrize("weights", ["model.safetensors", "model.pt", "pytorch_model.bin", "a.pth"])
def test_a_safetensors_file_and_a_pickle_read_the_same(tmp_path, weights):
    folder = source_folder(tmp_path / "src", weights, tokenizer=weights == "model.pt")
    source = read_source(folder)
    assert source.weights == folder / weights and source.config_file == folder / "config.json"
    assert source.config == {"model_type": "gpt2"}
    assert source.tokenizer_folder == (folder if weights == "model.pt" else None)
    assert sorted(source.tensors) == sorted(TENSORS)
    for name, tensor in TENSORS.items():
        assert torch.equal(source.tensors[name], tensor)
    assert read_source(folder / weights).tensors.keys() == TENSORS.keys()  # the weights file itself


def test_model_safetensors_wins_over_a_pickle_and_a_given_config_over_the_folders(tmp_path):
    folder = source_folder(tmp_path / "src")
    torch.save({"other": torch.zeros(1)}, folder / "model.pt")
    (tmp_path / "mine.json").write_text('{"normalization_type": "LN"}')
    assert weights_file(folder) == folder / "model.safetensors"
    assert config_file(folder / "model.safetensors", None) == folder / "config.json"
    source = read_source(folder, tmp_path / "mine.json")
    assert source.config == {"normalization_type": "LN"} and source.config_file == tmp_path / "mine.json"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda f: None, r"src: no such file or folder$"),
        (lambda f: f.mkdir(), r"src: no model.safetensors and no .pt, .pth or .bin state dict$"),
        (
            lambda f: (f.mkdir(), torch.save({}, f / "b.pt"), torch.save({}, f / "a.bin")),
            r"src: several weights files \(a.bin, b.pt\): give the one to import$",
        ),
    ],
)
def test_a_folder_without_one_weights_file_is_one_line(tmp_path, make, message):
    make(tmp_path / "src")
    with pytest.raises(qkov.QkovError, match=message):
        weights_file(tmp_path / "src")


def test_a_file_that_is_no_weights_file_is_one_line(tmp_path):
    (tmp_path / "model.onnx").write_bytes(b"x")
    with pytest.raises(
        qkov.QkovError, match=r"model.onnx: not a weights file \(expected .safetensors, .pt, .pth, .bin\)$"
    ):
        weights_file(tmp_path / "model.onnx")


def test_a_missing_or_bad_config_is_one_line(tmp_path):
    with pytest.raises(qkov.QkovError, match=r": no config.json \(give one with --config\)$"):
        read_config_file(tmp_path / "config.json")
    with pytest.raises(qkov.QkovError, match=r"mine.json: missing$"):
        read_config_file(tmp_path / "mine.json")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(qkov.QkovError, match=r"list.json: expected a JSON object$"):
        read_config_file(tmp_path / "list.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(qkov.QkovError, match="not valid JSON"):
        read_config_file(tmp_path / "bad.json")


def test_the_first_non_finite_tensor_is_named_in_the_sources_names():
    tensors = {"ok": torch.ones(2), "ids": torch.tensor([1, 2]), "h.0.w": torch.tensor([1.0, float("-inf")])}
    tensors["h.1.w"] = torch.tensor([float("nan")])
    with pytest.raises(qkov.QkovError, match=r"^src: tensor h.0.w has non-finite values \(NaN or inf\)$"):
        check_finite(tensors, "src")
    check_finite({"ok": torch.ones(2), "ids": torch.tensor([1, 2])}, "src")  # integers are never non-finite


@pytest.mark.parametrize(
    ("index", "message"),
    [
        ({}, "expected a weight_map of tensor names to shard files"),
        (
            {"weight_map": {"W": "../elsewhere.safetensors"}},
            "shard '../elsewhere.safetensors' is not a .safetensors",
        ),
        (
            {"weight_map": {"W": "a.safetensors", "V": "a.safetensors"}},
            "the shards and the index disagree on tensor V",
        ),
        ({"weight_map": {"W": "b.safetensors"}}, "b.safetensors: missing"),
    ],
)
def test_sharded_safetensors_are_read_through_their_index_checked(tmp_path, index, message):
    from safetensors.torch import save_file

    from qkov.interop.source import read_weights

    save_file({"W": torch.ones(2)}, str(tmp_path / "a.safetensors"))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert weights_file(tmp_path) == tmp_path / "model.safetensors.index.json"
    with pytest.raises(qkov.QkovError, match=message):
        read_weights(weights_file(tmp_path))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"W": "a.safetensors"}}))
    assert torch.equal(read_weights(weights_file(tmp_path))["W"], torch.ones(2))
