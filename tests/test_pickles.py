"""Pickled state dicts are read only through torch.load(weights_only=True): a payload that would
run code is refused before anything runs, an old torch is refused, and every bad file gets one line."""

from __future__ import annotations

import builtins
import os
import re

import pytest
import torch

import qkov
from qkov.cli import main
from qkov.errors import QkovError
from qkov.pickles import read_pickle, read_pickled_tensors

D_VOCAB, D_MODEL, N_CTX = 7, 4, 5


class RunsCode:
    """A pickle payload that, once unpickled, calls ``open(marker, "w")``: it creates a file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (builtins.open, (self.marker, "w"))


def tl_config(folder):
    """A TransformerLens-style config.json for a 0-layer model with standard positions."""
    config = {"n_layers": 0, "n_heads": 1, "d_model": D_MODEL, "d_head": 2, "d_vocab": D_VOCAB}
    config |= {"n_ctx": N_CTX, "normalization_type": None, "positional_embedding_type": "standard"}
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(__import__("json").dumps(config))


def zero_layer_state(seed=0):
    gen = torch.Generator().manual_seed(seed)
    return {
        "embed.W_E": torch.randn(D_VOCAB, D_MODEL, generator=gen, dtype=torch.float64),
        "pos_embed.W_pos": torch.randn(N_CTX, D_MODEL, generator=gen, dtype=torch.float64),
        "unembed.W_U": torch.randn(D_MODEL, D_VOCAB, generator=gen, dtype=torch.float64),
        "unembed.b_U": torch.randn(D_VOCAB, generator=gen, dtype=torch.float64),
    }


def one_line_error(capsys, argv):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("qkov: error: ") and "\n" not in err and "Traceback" not in err
    return err


def test_a_pickled_state_dict_imports_exactly(tmp_path):
    tl_config(tmp_path / "src")
    state = zero_layer_state()
    torch.save(state, tmp_path / "src" / "model.pth")
    main(["import", str(tmp_path / "src"), "--out", str(tmp_path / "out"), "--no-fold"])
    model = qkov.load(tmp_path / "out")
    tokens = torch.tensor([[0, 3, 6, 1, 2]])
    expected = (state["embed.W_E"][tokens] + state["pos_embed.W_pos"]) @ state["unembed.W_U"]
    torch.testing.assert_close(model(tokens), expected + state["unembed.b_U"], rtol=0, atol=1e-12)
    assert not list((tmp_path / "out").glob("*.pt*"))  # qkov writes safetensors only


def test_a_pickle_that_would_run_code_is_refused_and_runs_nothing(tmp_path, capsys):
    tl_config(tmp_path / "src")
    marker = tmp_path / "marker"
    torch.save(zero_layer_state() | {"W_E": RunsCode(marker)}, tmp_path / "src" / "model.pt")
    # the payload is real: the call an unpickler makes from its reduction creates a file (shown on
    # another marker, by making that call directly rather than unpickling anything)
    control = tmp_path / "control-marker"
    call, args = RunsCode(control).__reduce__()
    call(*args).close()
    assert control.exists()
    err = one_line_error(capsys, ["import", str(tmp_path / "src"), "--out", str(tmp_path / "out")])
    assert re.search(r"model\.pt: refused: the pickle would call \S*open, .* nothing was run", err), err
    assert not marker.exists() and not (tmp_path / "out").exists()
    with pytest.raises(qkov.QkovError, match="refused"):
        read_pickled_tensors(tmp_path / "src" / "model.pt")
    assert not marker.exists()


@pytest.mark.parametrize("old", ["2.5.1", "2.6.0", "2.9.1+cpu"])
def test_an_old_torch_is_refused_for_pickles_only(tmp_path, capsys, monkeypatch, old):
    tl_config(tmp_path / "src")
    torch.save(zero_layer_state(), tmp_path / "src" / "model.pth")
    monkeypatch.setattr(torch, "__version__", old)
    err = one_line_error(capsys, ["import", str(tmp_path / "src"), "--out", str(tmp_path / "out")])
    assert "needs torch >= 2.10" in err and "CVE-2025-32434" in err and f"this is torch {old}" in err
    assert not (tmp_path / "out").exists()
    # safetensors need no unpickler: the same weights import on the same torch
    from safetensors.torch import save_file

    (tmp_path / "src" / "model.pth").unlink()
    save_file(zero_layer_state(), tmp_path / "src" / "model.safetensors")
    main(["import", str(tmp_path / "src"), "--out", str(tmp_path / "out")])
    assert qkov.load(tmp_path / "out").cfg.d_vocab == D_VOCAB


BAD_PICKLES = {
    "not a pickle": (lambda f: f.write_bytes(b"not a pickle at all"), "not a readable PyTorch pickle"),
    "truncated": (
        lambda f: (torch.save(zero_layer_state(), f), f.write_bytes(f.read_bytes()[:200])),
        "not a readable PyTorch pickle",
    ),
    "a list": (lambda f: torch.save([torch.zeros(2)], f), "holds a list, not a state dict"),
    "nested": (
        lambda f: torch.save({"model": zero_layer_state(), "step": 3}, f),
        "entry 'model' holds a dict, not a tensor",
    ),
    "missing tensor": (
        lambda f: torch.save({k: v for k, v in zero_layer_state().items() if k != "unembed.W_U"}, f),
        "missing tensor W_U",
    ),
    "shape": (
        lambda f: torch.save(zero_layer_state() | {"embed.W_E": torch.zeros(D_VOCAB, 3)}, f),
        r"tensor W_E has shape \(7, 3\), config expects \(7, 4\)",
    ),
}


@pytest.mark.parametrize("kind", BAD_PICKLES)
def test_a_bad_pickle_gives_one_line(tmp_path, capsys, kind):
    tl_config(tmp_path / "src")
    make, message = BAD_PICKLES[kind]
    make(tmp_path / "src" / "model.pth")
    err = one_line_error(capsys, ["import", str(tmp_path / "src"), "--out", str(tmp_path / "out")])
    assert re.search(message, err), err
    assert not (tmp_path / "out").exists()


def test_several_pickles_in_a_folder_ask_for_one(tmp_path, capsys):
    tl_config(tmp_path / "src")
    for name in ("a_1000.pth", "a_final.pth"):
        torch.save(zero_layer_state(), tmp_path / "src" / name)
    err = one_line_error(capsys, ["import", str(tmp_path / "src"), "--out", str(tmp_path / "out")])
    assert "several weights files (a_1000.pth, a_final.pth): give the one to import" in err
    main(["import", str(tmp_path / "src" / "a_final.pth"), "--out", str(tmp_path / "out")])
    assert qkov.load(tmp_path / "out").cfg.source == "transformer_lens"


class CallsSystem:
    """A pickle whose loading would call ``os.system`` (pickled as ``posix.system``, a function of a
    module torch's unpickler blocks as a whole, in another wording than a lone global)."""

    def __reduce__(self):
        return (os.system, ("true",))


def test_a_blocked_module_is_refused_with_what_it_would_call(tmp_path):
    torch.save(CallsSystem(), tmp_path / "system.pt")
    with pytest.raises(QkovError, match=r"refused: the pickle would call (posix|nt)\.system") as info:
        read_pickle(tmp_path / "system.pt")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("content", [b"Q", b"\x80\x02Q", b"(", b"\x80\x04\x95"])
def test_a_few_bytes_of_damaged_pickle_are_one_line(tmp_path, content):
    """b"Q" made torch's restricted unpickler raise a bare IndexError (found by tests/test_fuzz.py)."""
    (tmp_path / "t.pt").write_bytes(content)
    with pytest.raises(QkovError, match="not a readable PyTorch pickle"):
        read_pickle(tmp_path / "t.pt")


def test_a_git_lfs_pointer_is_named_as_such(tmp_path):
    file = tmp_path / "model.pth"
    file.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 3\n")
    with pytest.raises(QkovError, match=r"model.pth: a git-lfs pointer, not the weights"):
        read_pickle(file)
