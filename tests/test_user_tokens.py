"""The user's own data (``--tokens``, ``--targets``): every format read to the same ids, and every
kind of bad data refused with one line and exit status 2, nothing written."""

from __future__ import annotations

import builtins
import json
import re

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


def huge_npy_header(file, shape=(100_000, 100_000_000)):
    """A .npy file of a few bytes whose header claims ``shape`` of int64 (numpy would allocate it)."""
    header = f"{{'descr': '<i8', 'fortran_order': False, 'shape': {shape}, }}"
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    file.write_bytes(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + bytes(64))
    return file


@pytest.mark.parametrize(
    ("name", "content", "words"),
    [
        ("bad.jsonl", b"\xff\xfe[1, 2]\n", "not UTF-8 text"),
        ("deep.jsonl", b"[" * 100_000 + b"]" * 100_000 + b"\n", "nested too deeply"),
        ("digits.jsonl", b"[" + b"9" * 5000 + b"]\n", "4300 digits"),
        ("wide.jsonl", b"[" + str(2**64).encode() + b"]\n", "does not fit in 64 bits"),
        ("zero.npy", b"", "not a readable .npy array"),
        ("huge.npy", None, "80,000,000,000,000 bytes"),
        ("uint64.npy", np.array([[1, 2**64 - 1]], dtype=np.uint64), "token id 18446744073709551615"),
        ("empty.npy", np.zeros((0,), dtype=np.int64), "no tokens"),
    ],
)
def test_hostile_token_files_are_one_line(tmp_path, name, content, words):
    """Each of these was a traceback (or a 23.8 GiB allocation, or id -1 for 2^64-1)."""
    file = tmp_path / name
    if content is None:
        huge_npy_header(file)
    elif isinstance(content, bytes):
        file.write_bytes(content)
    else:
        np.save(file, content)
    with pytest.raises(qkov.QkovError, match=re.escape(words)) as info:
        read_ids(file)
    assert "\n" not in str(info.value)


def test_uint64_safetensors_ids_above_int64_are_named_by_their_value(tmp_path):
    save_file({"tokens": torch.tensor([[3, 2**64 - 1]], dtype=torch.uint64)}, str(tmp_path / "t.safetensors"))
    with pytest.raises(qkov.QkovError, match="18446744073709551615"):
        read_ids(tmp_path / "t.safetensors")


def test_a_pickled_flat_list_is_one_row_and_a_list_of_odd_things_is_one_line(tmp_path):
    """torch.save([5, 7]) was a TypeError (len of an int), found by tests/test_fuzz.py."""
    torch.save([5, 7], tmp_path / "flat.pt")
    assert read_ids(tmp_path / "flat.pt").tolist() == [[5, 7]]
    torch.save([5, "x"], tmp_path / "odd.pt")
    with pytest.raises(qkov.QkovError, match="rows of token ids expected, found a int"):
        read_ids(tmp_path / "odd.pt")


def test_a_big_endian_npy_file_reads_as_its_values(tmp_path):
    """Found by the fuzzing suite: ``.npy`` ids stored big-endian (``>i8``) were a ValueError
    traceback (torch converts native byte order only)."""
    import numpy as np

    from qkov.data.user_tokens import read_user_tokens

    ids = np.array([[1, 2, 3, 4]], dtype=">i8")
    np.save(tmp_path / "tokens.npy", ids)
    cfg = qkov.Config(n_layers=1, n_heads=1, d_model=4, d_head=4, d_vocab=10, n_ctx=8)
    tokens = read_user_tokens(tmp_path / "tokens.npy", None, cfg)
    assert tokens.tokens.tolist() == [[1, 2, 3, 4]]
