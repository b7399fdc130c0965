"""The user's own data (``--tokens``, ``--targets``): every format read to the same ids, and every
kind of bad data refused with one line and exit status 2, nothing written."""

from __future__ import annotations

import builtins
import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import qkov
from qkov.cli import main
from qkov.data.user_tokens import IGNORE, next_token_targets, read_ids, read_user_tokens

from conftest import random_model


class Payload:
    """A pickle whose loading would create the file ``marker``."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (builtins.open, (self.marker, "w"))


CFG = qkov.Config(n_layers=1, n_heads=2, d_model=8, d_head=4, d_vocab=12, n_ctx=6)
IDS = np.array([[11, 0, 3, 4, 5], [1, 2, 3, 9, 10]], dtype=np.int64)


def write(folder, name: str, ids: np.ndarray | list, key: str = "tokens"):
    """``ids`` in the format of ``name``'s suffix."""
    file = folder / name
    if name.endswith(".npy"):
        np.save(file, np.asarray(ids))
    elif name.endswith(".safetensors"):
        save_file({key: torch.as_tensor(np.asarray(ids))}, str(file))
    elif name.endswith(".pt"):
        torch.save(torch.as_tensor(np.asarray(ids)), file)
    else:
        file.write_text("".join(json.dumps(list(map(int, row))) + "\n" for row in ids))
    return file


@pytest.mark.parametrize("name", ["t.npy", "t.safetensors", "t.pt", "t.jsonl"])
def test_every_format_reads_the_same_ids(tmp_path, name):
    ids = read_ids(write(tmp_path, name, IDS))
    assert ids.dtype == torch.int64 and ids.tolist() == IDS.tolist()


def test_pickled_rows_and_dicts_and_a_single_row(tmp_path):
    torch.save([[1, 2, 3], [4, 5, 6]], tmp_path / "rows.pt")
    torch.save({"tokens": torch.tensor([[1, 2]]), "targets": torch.tensor([[2, -100]])}, tmp_path / "d.pt")
    np.save(tmp_path / "one.npy", np.array([3, 4, 5]))
    assert read_ids(tmp_path / "rows.pt").tolist() == [[1, 2, 3], [4, 5, 6]]
    assert read_ids(tmp_path / "d.pt", "targets").tolist() == [[2, -100]]
    assert read_ids(tmp_path / "one.npy").tolist() == [[3, 4, 5]]


def test_the_default_targets_are_the_next_token(tmp_path):
    data = read_user_tokens(write(tmp_path, "t.npy", IDS), None, CFG)
    assert data.targets.tolist() == [[0, 3, 4, 5, IGNORE], [2, 3, 9, 10, IGNORE]]
    assert data.targeted == 8 and "t.npy (2 x 5 tokens; the next token as targets)" in data.description
    assert torch.equal(next_token_targets(data.tokens), data.targets)


def test_given_targets_keep_their_ignored_positions(tmp_path):
    targets = np.full_like(IDS, IGNORE)
    targets[:, -1] = [7, 2]
    data = read_user_tokens(write(tmp_path, "t.jsonl", IDS), write(tmp_path, "y.npy", targets), CFG)
    assert data.targets.tolist() == targets.tolist() and data.targeted == 2
    assert "targets y.npy" in data.description


def _bad(tmp_path):
    """Each kind of bad data: (files to write, the command's extra arguments, the one line's words)."""
    ok = IDS
    return {
        "id outside the vocabulary": (
            {"t.npy": np.array([[1, 12, 3]])},
            [],
            "token id 12 at row 0, position 1",
        ),
        "negative id": ({"t.jsonl": [[1, -1, 3]]}, [], "token id -1 at row 0, position 1"),
        "ragged rows": ({"t.jsonl": None}, [], "ragged rows (lengths 2 to 3)"),
        "too long": ({"t.npy": np.ones((2, 7), dtype=np.int64)}, [], "longer than the context (n_ctx=6)"),
        "empty": ({"t.jsonl": []}, [], "no tokens"),
        "float ids": ({"t.npy": np.ones((2, 3))}, [], "must be integers"),
        "three dimensions": (
            {"t.safetensors": np.ones((2, 2, 2), dtype=np.int64)},
            [],
            "expected [batch, pos]",
        ),
        "unknown kind": ({"t.csv": None}, [], "unknown kind of file"),
        "targets of another shape": ({"t.npy": ok, "y.npy": ok[:, :4]}, ["y.npy"], "targets of shape (2, 4)"),
        "target outside the outputs": ({"t.npy": ok, "y.npy": np.full_like(ok, 12)}, ["y.npy"], "target 12"),
        "no target at all": ({"t.npy": ok, "y.npy": np.full_like(ok, IGNORE)}, ["y.npy"], "no position has"),
        "a pickle that runs code": ({"t.pt": None}, [], "refused"),
    }


@pytest.mark.parametrize("case", list(_bad(None)))
def test_bad_data_is_one_line_and_exit_2_with_nothing_written(tmp_path, capsys, case):
    files, targets, words = _bad(tmp_path)[case]
    for name, ids in files.items():
        if case == "ragged rows":
            (tmp_path / name).write_text("[1, 2]\n[1, 2, 3]\n")
        elif case == "unknown kind":
            (tmp_path / name).write_text("1,2\n")
        elif case == "a pickle that runs code":
            torch.save(Payload(str(tmp_path / "ran")), tmp_path / name)
        else:
            write(tmp_path, name, ids)
    qkov.save(random_model(CFG), tmp_path / "ckpt")
    args = ["analyze", str(tmp_path / "ckpt"), "--out", str(tmp_path / "out"), "--quiet"]
    args += ["--tokens", str(tmp_path / next(iter(files)))]
    args += ["--targets", str(tmp_path / targets[0])] if targets else []
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and err.startswith("qkov: error:") and len(err.splitlines()) == 1, err
    assert words in err
    assert not (tmp_path / "out").exists() and not (tmp_path / "ran").exists()


def test_a_classifier_needs_its_targets_and_targets_need_tokens(tmp_path, capsys):
    classifier = qkov.Config(n_layers=1, n_heads=2, d_model=8, d_head=4, d_vocab=12, n_ctx=6, d_vocab_out=2)
    with pytest.raises(qkov.QkovError, match="outputs are not tokens"):
        read_user_tokens(write(tmp_path, "t.npy", IDS), None, classifier)
    qkov.save(random_model(CFG), tmp_path / "ckpt")
    with pytest.raises(SystemExit):
        main(["analyze", str(tmp_path / "ckpt"), "--targets", str(write(tmp_path, "y.npy", IDS)), "--quiet"])
    assert "--targets needs --tokens" in capsys.readouterr().err
