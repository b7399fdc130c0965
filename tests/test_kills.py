"""Kill tests: each command that writes, killed with SIGKILL in the middle of an atomic write (as
soon as its hidden temporary file appears), leaves no visible file half-written, and the same
command run again succeeds and removes the killed write's leftover temporary."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import qkov
from qkov.interop import save_transformer_lens
from qkov.results import load_results

from conftest import random_model
from interop_models import tl_model

CFG = qkov.Config(n_layers=2, n_heads=4, d_model=64, d_head=16, d_vocab=2000, n_ctx=32)


def temporaries(folder: Path) -> list[Path]:
    return sorted(folder.rglob(".*.tmp")) if folder.exists() else []


def kill_at_first_temporary(argv: list[str], folder: Path) -> bool:
    """Run ``qkov ARGV``, SIGKILL it as soon as a temporary file appears in ``folder``; whether it
    was killed so (else it finished first)."""
    victim = subprocess.Popen(
        [sys.executable, "-m", "qkov.cli", *argv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.time() + 300
    while victim.poll() is None and time.time() < deadline:
        if temporaries(folder):
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            return True
        time.sleep(0.001)
    victim.kill()
    victim.wait()
    return False


def kill_leaving_a_temporary(argv: list[str], folder: Path, tries: int = 8) -> bool:
    """Kill ``qkov ARGV`` at its first temporary file until a kill lands before that file's rename
    (the rename can win the race between seeing the file and the signal): whether one did."""
    for _ in range(tries):
        shutil.rmtree(folder, ignore_errors=True)
        if kill_at_first_temporary(argv, folder) and temporaries(folder):
            return True
    return False


def rerun(argv: list[str]) -> None:
    done = subprocess.run([sys.executable, "-m", "qkov.cli", *argv], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def every_visible_file_is_whole(folder: Path) -> None:
    for file in folder.iterdir():
        if file.name == "results.json":
            load_results(file)
        elif file.suffix == ".json" or file.name == "metrics.jsonl":
            text = file.read_text()
            [json.loads(line) for line in text.splitlines()] if file.suffix == ".jsonl" else json.loads(text)
        elif file.name == "report.html":
            assert file.read_text().rstrip().endswith("</html>")
    if (folder / "model.safetensors").exists():
        qkov.load(folder)


@pytest.mark.slow
@pytest.mark.parametrize("command", ["analyze", "import"])
def test_a_killed_write_leaves_whole_files_and_the_rerun_cleans_up(tmp_path, command):
    qkov.save(random_model(CFG), tmp_path / "ckpt")
    save_transformer_lens(tl_model(attn_only=True, d_vocab=5000), tmp_path / "tl")
    out = tmp_path / "out"
    argv = {
        "analyze": ["analyze", str(tmp_path / "ckpt"), "--out", str(out), "--quiet", "--threads", "1"],
        "import": ["import", str(tmp_path / "tl"), "--out", str(out), "--force"],
    }[command]
    assert kill_leaving_a_temporary(argv, out), "no kill landed while a temporary file was open"
    every_visible_file_is_whole(out)
    rerun(argv)
    assert temporaries(out) == []
    every_visible_file_is_whole(out)


@pytest.mark.slow
def test_a_training_run_killed_mid_write_resumes_and_cleans_up(tmp_path, tiny_corpus):
    out = tmp_path / "run"
    argv = ["train", "--layers", "1", "--out", str(out), "--corpus", str(tiny_corpus), "--steps", "40",
            "--batch-size", "4", "--d-model", "32", "--n-ctx", "32", "--vocab-size", "300", "--threads", "1",
            "--checkpoint-every", "5", "--quiet"]  # fmt: skip
    assert kill_leaving_a_temporary(argv, out)
    every_visible_file_is_whole(out)
    rerun([*argv, "--resume"])
    assert temporaries(out) == []
    every_visible_file_is_whole(out)
    assert os.path.exists(out / "training_state.safetensors")


@pytest.mark.slow
def test_a_series_killed_mid_write_continues_and_cleans_up(tmp_path):
    """``qkov series`` rewrites series.jsonl atomically after each checkpoint: killed at its first
    write, the rerun continues from the rows kept and removes the leftover temporary."""
    from test_series import TOKENS_PER_STEP, gentle_induction_model, untrained, write_series

    end = gentle_induction_model()
    write_series(tmp_path / "two", untrained(end.cfg), end)
    out = tmp_path / "out"
    argv = ["series", str(tmp_path / "two"), "--out", str(out), "--tokens-per-step", str(TOKENS_PER_STEP),
            "--eval-tokens", "2048", "--quiet", "--threads", "1"]  # fmt: skip
    assert kill_leaving_a_temporary(argv, out)
    every_visible_file_is_whole(out)
    rerun(argv)
    assert temporaries(out) == []
    every_visible_file_is_whole(out)
    assert load_results(out / "results.json").phase_change is not None


@pytest.mark.slow
def test_a_reproduction_killed_mid_write_resumes_and_cleans_up(tmp_path, tiny_corpus):
    """``qkov reproduce --quick`` killed at its first write (a model's first checkpoint) leaves
    whole files; the rerun resumes, finishes and removes the leftover temporary."""
    out = tmp_path / "reproduce"
    argv = ["reproduce", "--quick", "--out", str(out), "--corpus", str(tiny_corpus), "--threads", "1"]
    assert kill_leaving_a_temporary(argv, out)
    for folder in [out, *(p for p in out.iterdir() if p.is_dir())]:
        every_visible_file_is_whole(folder)
    rerun(argv)
    assert temporaries(out) == []
    every_visible_file_is_whole(out)
    assert len(load_results(out / "results.json").claims) == 9
