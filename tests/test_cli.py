"""The command line: bad input gives one line on stderr and exit status 2, never a traceback."""

from __future__ import annotations

import os

import pytest
import torch

import qkov
from qkov.cli import main
from qkov.training_log import TrainingPoint, append_training_point

from conftest import random_model


def run(capsys, *argv):
    with pytest.raises(SystemExit) as exit_info:
        main(list(argv))
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


def assert_one_line_error(code, err, message):
    assert code == 2
    assert err.startswith("qkov: error: ") and message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_empty_corpus(capsys, tmp_path):
    code, _, err = run(
        capsys, "train", "--layers", "1", "--out", str(tmp_path / "o"), "--corpus", str(tmp_path)
    )
    assert_one_line_error(code, err, "corpus: no text")
    assert not (tmp_path / "o").exists()


def test_binary_corpus(capsys, tmp_path):
    (tmp_path / "a.bin").write_bytes(bytes(range(256)) * 10)
    code, _, err = run(
        capsys, "train", "--layers", "1", "--out", str(tmp_path / "o"), "--corpus", str(tmp_path)
    )
    assert_one_line_error(code, err, "1 binary or undecodable")


def test_config_that_does_not_fit(capsys, tmp_path, tiny_corpus):
    code, _, err = run(
        capsys,
        "train",
        "--layers",
        "1",
        "--out",
        str(tmp_path / "o"),
        "--corpus",
        str(tiny_corpus),
        "--vocab-size",
        "300",
        "--d-head",
        "0",
    )
    assert_one_line_error(code, err, "d_head must be a positive integer")


def test_vocabulary_too_small(capsys, tmp_path, tiny_corpus):
    code, _, err = run(
        capsys,
        "train",
        "--layers",
        "0",
        "--out",
        str(tmp_path / "o"),
        "--corpus",
        str(tiny_corpus),
        "--vocab-size",
        "50",
    )
    assert_one_line_error(code, err, "at least 257")


def test_context_longer_than_the_corpus(capsys, tmp_path):
    (tmp_path / "a.txt").write_text("short text " * 30)
    code, _, err = run(
        capsys,
        "train",
        "--layers",
        "1",
        "--out",
        str(tmp_path / "o"),
        "--corpus",
        str(tmp_path / "a.txt"),
        "--vocab-size",
        "260",
        "--n-ctx",
        "4096",
        "--steps",
        "1",
    )
    assert_one_line_error(code, err, "fewer than one window of n_ctx + 1 = 4097")


def test_info_describes_a_checkpoint(capsys, tmp_path):
    qkov.save(random_model(qkov.Config(1, 2, 8, 4, 20, 8)), tmp_path)
    code, out, _ = run_ok(capsys, "info", str(tmp_path))
    assert "n_layers: 1" in out and "tokenizer: none" in out


def run_ok(capsys, *argv):
    main(list(argv))
    captured = capsys.readouterr()
    return 0, captured.out, captured.err


def test_info_on_a_corrupt_checkpoint(capsys, tmp_path):
    qkov.save(random_model(qkov.Config(1, 2, 8, 4, 20, 8)), tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"garbage")
    code, _, err = run(capsys, "info", str(tmp_path))
    assert_one_line_error(code, err, "truncated or corrupt")


@pytest.mark.parametrize(
    ("device", "message"),
    [("mps", "only cpu and cuda"), ("tpu", "not a device name")]
    + ([] if torch.cuda.is_available() else [("cuda", "no CUDA device is available")]),
)
@pytest.mark.parametrize("command", ["train", "analyze", "reproduce"])
def test_an_unusable_device_is_one_line(capsys, tmp_path, tiny_corpus, device, message, command):
    out = tmp_path / "o"
    qkov.save(random_model(qkov.Config(1, 2, 8, 4, 20, 8)), tmp_path / "ckpt")
    argv = {
        "train": ["--layers", "1", "--corpus", str(tiny_corpus), "--vocab-size", "300"],
        "analyze": [str(tmp_path / "ckpt")],
        "reproduce": ["--quick", "--corpus", str(tiny_corpus)],
    }[command]
    code, _, err = run(capsys, command, *argv, "--out", str(out), "--device", device)
    assert_one_line_error(code, err, message)
    assert not out.exists()


def test_every_command_defines_threads_once_and_serve_uses_every_core(capsys, tmp_path, monkeypatch):
    import qkov.serve

    for command in ("train", "analyze", "reproduce", "serve"):
        code, out, _ = run(capsys, command, "--help")
        assert code == 0 and out.count("\n  --threads THREADS") == 1, command
    qkov.save(random_model(qkov.Config(1, 2, 8, 4, 20, 8)), tmp_path)
    served = []
    monkeypatch.setattr(qkov.serve, "serve", lambda *a: served.append(torch.get_num_threads()))
    threads = torch.get_num_threads()
    try:
        run_ok(capsys, "serve", str(tmp_path))
        run_ok(capsys, "serve", str(tmp_path), "--threads", "1")
    finally:
        torch.set_num_threads(threads)
    assert served == [os.cpu_count(), 1]


def test_info_shows_the_training_logs_last_row(capsys, tmp_path):
    qkov.save(random_model(qkov.Config(1, 2, 8, 4, 20, 8)), tmp_path)
    append_training_point(tmp_path, TrainingPoint(step=10, tokens=80, train_loss=3.0))
    append_training_point(tmp_path, TrainingPoint(step=20, tokens=160, train_loss=2.123456789, eval_loss=2.5))
    _, out, _ = run_ok(capsys, "info", str(tmp_path))
    assert out.splitlines()[-1] == "  last metrics: step 20, tokens 160, train_loss 2.12346, eval_loss 2.5"
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    code, _, err = run(capsys, "info", str(tmp_path))
    assert_one_line_error(code, err, "metrics.jsonl, line 1: tokens: Field required")
