"""The command line: bad input gives one line on stderr and exit status 2, never a traceback."""

from __future__ import annotations

import json
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


def tiny_checkpoint(folder, **overrides):
    cfg = qkov.Config(**({"n_layers": 1, "n_heads": 2, "d_model": 8, "d_head": 4, "d_vocab": 12, "n_ctx": 6}))
    qkov.save(random_model(cfg), folder)
    if overrides:
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps(config | overrides))
    return folder


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--layers", "1", "--out", "{bad}", "--corpus", "{corpus}"],
        ["analyze", "{ckpt}", "--out", "{bad}", "--quiet"],
        ["import", "{ckpt}", "--out", "{bad}"],
        ["series", "{tmp}", "--out", "{bad}", "--quiet"],
        ["reproduce", "--out", "{bad}", "--quick", "--quiet"],
    ],
    ids=lambda argv: argv[0],
)
def test_an_output_folder_that_cannot_be_written_is_refused_before_any_work(
    capsys, tmp_path, tiny_corpus, argv
):
    """--out under a file: one line and exit 2 at once (train refused it only after preparing the
    corpus and tokenizer, the others after their work, with a traceback)."""
    (tmp_path / "file").write_text("")
    fields = {"bad": tmp_path / "file" / "out", "corpus": tiny_corpus, "tmp": tmp_path}
    fields["ckpt"] = tiny_checkpoint(tmp_path / "ckpt")
    before = set(tmp_path.rglob("*"))
    code, _, err = run(capsys, *(arg.format(**fields) for arg in argv))
    assert_one_line_error(code, err, "is not a folder")
    assert set(tmp_path.rglob("*")) == before


@pytest.mark.parametrize("command", ["analyze", "train", "series", "reproduce", "serve"])
def test_threads_outside_what_the_machine_takes_are_one_line(capsys, tmp_path, command):
    argv = {
        "analyze": ["analyze", str(tiny_checkpoint(tmp_path / "c")), "--out", str(tmp_path / "o")],
        "train": ["train", "--layers", "1", "--out", str(tmp_path / "o")],
        "series": ["series", str(tmp_path), "--out", str(tmp_path / "o")],
        "reproduce": ["reproduce", "--out", str(tmp_path / "o")],
        "serve": ["serve", str(tiny_checkpoint(tmp_path / "c")), "--port", "1"],
    }[command]
    for threads in ("-1", "0", "10000000", str(2**70)):  # ten million was a segmentation fault
        code, _, err = run(capsys, *argv, "--threads", threads)
        assert_one_line_error(
            code, err, f"--threads must lie in [1, {8 * os.cpu_count()}] on this machine, got"
        )
    assert not (tmp_path / "o").exists()


def test_import_refuses_to_overwrite_a_run_unless_forced(capsys, tmp_path):
    """qkov import --out on a training run replaced its weights and kept its state and log; now it
    refuses, and with --force leaves only the imported model."""
    from interop_models import gpt2_folder

    gpt2_folder(tmp_path / "gpt2")
    capsys.readouterr()  # the model's own save progress
    run_folder = tiny_checkpoint(tmp_path / "run")
    for name in ("train_config.json", "metrics.jsonl", "training_state.safetensors"):
        (run_folder / name).write_text("{}")
    before = {p.name: p.read_bytes() for p in run_folder.iterdir()}
    code, _, err = run(capsys, "import", str(tmp_path / "gpt2"), "--out", str(run_folder))
    assert_one_line_error(code, err, "already holds a checkpoint or training run")
    assert {p.name: p.read_bytes() for p in run_folder.iterdir()} == before
    main(["import", str(tmp_path / "gpt2"), "--out", str(run_folder), "--force"])
    assert sorted(p.name for p in run_folder.iterdir()) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
    ]
    assert qkov.load(run_folder).cfg.source == "huggingface"


def test_serve_on_a_busy_port_is_one_line_before_loading(capsys, tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out, err = run(capsys, "serve", str(tiny_checkpoint(tmp_path / "c")), "--port", str(port))
    assert_one_line_error(code, err, f"cannot listen on 127.0.0.1:{port}")
    assert "another program is using the port" in err and out == ""


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"n_layers": 10**6}, "n_layers 1,000,000 is more than 4,096"),
        ({"d_model": 10**8}, "would take"),
    ],
)
def test_absurd_sizes_are_refused_before_anything_is_built(capsys, tmp_path, monkeypatch, overrides, words):
    monkeypatch.setenv("QKOV_MAX_BYTES", str(2**32))
    folder = tiny_checkpoint(tmp_path / "c", **overrides)
    for argv in (["info", str(folder)], ["analyze", str(folder), "--out", str(tmp_path / "o")]):
        code, _, err = run(capsys, *argv)
        assert_one_line_error(code, err, words)


def test_train_refuses_an_absurd_width_before_reading_the_corpus(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("QKOV_MAX_BYTES", str(2**32))
    code, _, err = run(
        capsys, "train", "--layers", "1", "--out", str(tmp_path / "o"), "--d-model", str(10**7),
        "--corpus", str(tmp_path / "no-such-corpus"),
    )  # fmt: skip
    assert_one_line_error(code, err, "4 copies of 4-byte floats")
    assert not (tmp_path / "o").exists()


def test_a_tokenizer_link_to_nowhere_and_a_deeply_nested_config_are_one_line(capsys, tmp_path):
    folder = tiny_checkpoint(tmp_path / "c")
    (folder / "tokenizer.json").symlink_to(folder / "tokenizer.json")
    code, _, err = run(capsys, "info", str(folder))
    assert_one_line_error(code, err, "a link that leads to no file")
    (folder / "tokenizer.json").unlink()
    (folder / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    code, _, err = run(capsys, "info", str(folder))
    assert_one_line_error(code, err, "nested too deeply")


def test_a_checkpoint_under_a_path_that_is_not_utf8_reads_back(capsys, tmp_path):
    folder = tmp_path / os.fsdecode(b"caf\xe9")
    tiny_checkpoint(folder)
    main(["info", str(folder)])
    assert "parameters" in capsys.readouterr().out


def test_weights_of_3e38_are_refused_by_analyze_not_a_traceback(capsys, tmp_path):
    """Finite float32 weights of 3e38 made the spectra's SVD fail on infinities (and a results.json
    of NaN); found by tests/test_fuzz.py flipping an exponent bit."""
    folder = tiny_checkpoint(tmp_path / "c")
    model = qkov.load(folder)
    with torch.no_grad():
        model.W_E[3, 2] = 3e38
    qkov.save(model, folder)
    code, _, err = run(capsys, "analyze", str(folder), "--out", str(tmp_path / "o"), "--quiet")
    assert_one_line_error(code, err, "tensor W_E has a value of magnitude 3e+38, above 1e+06")
    assert not (tmp_path / "o").exists()


def test_a_full_disk_under_analyze_is_one_line_not_a_traceback(capsys, tmp_path, monkeypatch):
    """The filesystem refusing a write (ENOSPC, as a full disk does) after the analysis: one line
    naming the file and exit 2; nothing half-written is left."""
    import errno

    import qkov.io

    folder = tiny_checkpoint(tmp_path / "c")

    def full(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(qkov.io.os, "replace", full)
    code, _, err = run(capsys, "analyze", str(folder), "--out", str(tmp_path / "out"), "--quiet")
    assert_one_line_error(code, err, "could not be written (No space left on device)")
    out = tmp_path / "out"
    assert not out.exists() or not any(out.iterdir())
