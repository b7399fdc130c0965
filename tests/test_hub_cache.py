"""A model by its Hugging Face name, from a local cache built here with the real layout
(``models--org--name/blobs`` holding the files under their hashes, ``snapshots/<commit>/`` holding
links into ``blobs``, ``refs/<revision>`` holding the commit): the settings' precedence, revisions,
a folder of the same name winning, and one line naming every place looked at when it is not there.
Nothing touches the network: a connection attempt fails the test."""

from __future__ import annotations

import hashlib
import json
import os
import socket
from pathlib import Path

import pytest
import torch

import qkov
from families import random_hf_model
from qkov.cli import main
from qkov.hub_cache import hub_cache_folder, hub_name, resolve_source

pytest.importorskip("transformers")

REPO = "tiny-org/tiny-gpt2"
CACHE_VARIABLES = ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME")


def saved_hf_model(folder: Path, seed: int) -> Path:
    """A 2-layer GPT-2 of ``transformers``, random weights from ``seed``, as save_pretrained writes it."""
    import transformers as t

    config = t.GPT2Config(vocab_size=61, n_embd=32, n_layer=2, n_head=4, n_positions=32)
    random_hf_model(config, seed).save_pretrained(folder)
    return folder


def put_in_cache(hub: Path, repo: str, source: Path, commit: str, refs: tuple[str, ...] = ("main",)) -> Path:
    """``source``'s files in the cache at ``hub`` as huggingface_hub stores them; returns the snapshot."""
    model = hub / f"models--{repo.replace('/', '--')}"
    snapshot = model / "snapshots" / commit
    (model / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True)
    for file in sorted(source.iterdir()):
        data = file.read_bytes()
        blob = model / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / file.name).symlink_to(Path("..") / ".." / "blobs" / blob.name)
    for ref in refs:
        (model / "refs").mkdir(exist_ok=True)
        (model / "refs" / ref).write_text(commit)  # as huggingface_hub writes it: no newline
    return snapshot


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[Path, Path]:
    """Two saved models of different weights: the main revision's and an older one's."""
    root = tmp_path_factory.mktemp("saved")
    return saved_hf_model(root / "main", seed=0), saved_hf_model(root / "old", seed=1)


@pytest.fixture
def hub(tmp_path, monkeypatch, models) -> Path:
    """A cache holding REPO at main (commit "a" * 40) and at v1 (commit "b" * 40), named by
    HF_HUB_CACHE; the working folder is empty, and any network connection fails."""
    for variable in CACHE_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    folder = tmp_path / "hub"
    put_in_cache(folder, REPO, models[0], "a" * 40)
    put_in_cache(folder, REPO, models[1], "b" * 40, refs=("v1",))
    monkeypatch.setenv("HF_HUB_CACHE", str(folder))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)

    def no_network(*args, **kwargs):
        raise AssertionError("qkov tried to reach the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    return folder


def same_weights(a: qkov.Transformer, b: qkov.Transformer) -> bool:
    pairs = zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    return all(torch.equal(x, y) for x, y in pairs)


def test_a_name_opens_the_cached_snapshot_through_its_links(hub, models):
    model = qkov.open_model(REPO)
    assert same_weights(model, qkov.open_model(models[0]))
    assert not same_weights(model, qkov.open_model(models[1]))
    assert model.cfg.source.startswith("huggingface")
    snapshot = resolve_source(REPO)
    assert snapshot == hub / "models--tiny-org--tiny-gpt2" / "snapshots" / ("a" * 40)
    assert (snapshot / "model.safetensors").is_symlink()


@pytest.mark.parametrize("revision", ["v1", "b" * 40], ids=["a ref", "a commit hash"])
def test_a_revision_is_a_ref_or_a_commit(hub, models, revision):
    assert same_weights(qkov.open_model(f"{REPO}@{revision}"), qkov.open_model(models[1]))
    assert same_weights(qkov.open_model(f"{REPO}@main"), qkov.open_model(models[0]))


def test_the_settings_are_read_in_huggingface_hubs_order(tmp_path, monkeypatch):
    for variable in CACHE_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert hub_cache_folder()[0] == tmp_path / "home" / ".cache" / "huggingface" / "hub"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hub_cache_folder()[0] == tmp_path / "xdg" / "huggingface" / "hub"
    monkeypatch.setenv("HF_HOME", "~/hf")  # expanded, as huggingface_hub does
    assert hub_cache_folder() == (tmp_path / "home" / "hf" / "hub", "HF_HOME/hub")
    monkeypatch.setenv("HUGGINGFACE_HUB_CACHE", str(tmp_path / "old-name"))
    assert hub_cache_folder()[0] == tmp_path / "old-name"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert hub_cache_folder() == (tmp_path / "hub", "HF_HUB_CACHE")


def test_hf_hub_cache_wins_over_hf_home(hub, tmp_path, monkeypatch, models):
    """The same name in two caches: HF_HUB_CACHE's is read; without it, HF_HOME/hub's."""
    put_in_cache(tmp_path / "home" / "hub", REPO, models[1], "c" * 40)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert same_weights(qkov.open_model(REPO), qkov.open_model(models[0]))
    monkeypatch.delenv("HF_HUB_CACHE")
    assert same_weights(qkov.open_model(REPO), qkov.open_model(models[1]))
    assert resolve_source(REPO).name == "c" * 40


def test_a_folder_of_the_same_name_wins_over_the_cache(hub, models):
    qkov.save(qkov.open_model(models[1]), Path(REPO))  # ./tiny-org/tiny-gpt2, a qkov checkpoint
    assert resolve_source(REPO) == Path(REPO)
    assert same_weights(qkov.open_model(REPO), qkov.open_model(models[1]))


def one_error_line(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("qkov: error: "), captured.err
    return lines[0]


@pytest.mark.parametrize("command", ["analyze", "info", "serve", "import"])
def test_a_missing_model_is_one_line_naming_every_place_looked(hub, capsys, command):
    argv = [command, "tiny-org/missing"] + (["--out", "x"] if command == "import" else [])
    line = one_error_line(capsys, argv)
    assert "tiny-org/missing" in line and "never downloads" in line
    assert str(hub / "models--tiny-org--missing") in line and "HF_HUB_CACHE" in line
    assert str(Path.cwd() / "tiny-org" / "missing") in line
    assert not any(Path.cwd().iterdir())  # nothing written


def test_a_missing_revision_names_the_ref_and_the_snapshot_looked_for(hub, capsys):
    line = one_error_line(capsys, ["info", f"{REPO}@v2"])
    model = hub / "models--tiny-org--tiny-gpt2"
    assert str(model / "refs" / "v2") in line and str(model / "snapshots" / "v2") in line
    assert "refs cached: main, v1" in line and "never downloads" in line


def test_a_ref_to_a_missing_snapshot_is_one_line(hub, capsys):
    model = hub / "models--tiny-org--tiny-gpt2"
    (model / "refs" / "main").write_text("d" * 40)
    line = one_error_line(capsys, ["analyze", REPO])
    assert f"refs/main names commit {'d' * 40}" in line and str(model / "snapshots" / ("d" * 40)) in line
    assert "never downloads" in line
    with pytest.raises(qkov.QkovError, match="is missing"):
        qkov.open_model(REPO)


def test_a_link_to_a_missing_blob_is_one_line(hub, capsys):
    snapshot = resolve_source(REPO)
    os.unlink(snapshot / "model.safetensors")
    (snapshot / "model.safetensors").symlink_to(Path("..") / ".." / "blobs" / ("0" * 64))
    line = one_error_line(capsys, ["info", REPO])
    assert "model.safetensors is a link to a missing blob" in line


def test_analyze_info_and_import_by_name(hub, capsys):
    main(["info", REPO])
    assert "n_layers: 2" in capsys.readouterr().out
    main(["analyze", REPO, "--quiet", "--weights-only"])
    out = Path("analysis") / "tiny-org--tiny-gpt2"  # never into the cache
    results = json.loads((out / "results.json").read_text())
    assert results["spectra"] is not None and "composition" in results["steps"]["ran"]
    assert not list(hub.rglob("analysis"))
    main(["import", f"{REPO}@v1", "--out", "imported"])
    assert same_weights(qkov.load("imported"), qkov.open_model(f"{REPO}@v1"))


@pytest.mark.parametrize(
    "text, expected",
    [
        ("EleutherAI/pythia-160m", ("EleutherAI", "pythia-160m", None)),
        ("org/name@refs/pr/1", ("org", "name", "refs/pr/1")),
        ("meta-llama/Llama-3.2-1B@main", ("meta-llama", "Llama-3.2-1B", "main")),
        ("/abs/path", None),
        ("a/b/c", None),
        ("../x", None),
        ("org/na--me", None),
        ("org/name@../x", None),
        ("gpt2", None),
    ],
)
def test_what_reads_as_a_name(text, expected):
    name = hub_name(text)
    assert (None if name is None else (name.org, name.name, name.revision)) == expected
