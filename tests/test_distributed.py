"""Training in several processes (torchrun + DDP over gloo, on loopback): the same global batch,
the same weights within float32 rounding, rank 0 alone writes, Ctrl-C stops every worker after a
checkpoint, and a run resumes with another number of processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from qkov.distributed import Processes, torchrun_command
from qkov.schedule import TrainConfig
from test_train import TINY, load_state_step, qkov_cli, tiny_run

# 2 processes x B/2 against 1 process x B after 50 steps of the tiny model: the largest weight
# difference measured was 1.7e-6 (weights up to 4.3); 2 processes equal 1 process with 2
# micro-batches bit for bit (each adds the same two halves).
TOLERANCE = 1e-5
STEPS = ["--steps", "50", "--eval-every", "10", "--checkpoint-every", "5"]


def assert_close(a, b, atol=TOLERANCE):
    ours, theirs = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert torch.allclose(ours[name], theirs[name], rtol=0, atol=atol), (
            name,
            (ours[name] - theirs[name]).abs().max(),
        )


def train_args(corpus, out, *extra):
    return ["train", "--layers", "2", "--corpus", str(corpus), *TINY, *STEPS, "--out", str(out), *extra]


def test_each_process_trains_on_its_slice_of_the_global_batch(tiny_corpus, tmp_path):
    trainer = tiny_run(tiny_corpus, tmp_path / "run", batch_size=8)
    (whole,) = trainer.micro_batches(step=3)
    for grad_accum in (1, 2):
        trainer.grad_accum = grad_accum
        parts = []
        for rank in range(2):
            trainer.processes = Processes(rank=rank, world_size=2)
            parts += trainer.micro_batches(step=3)
        assert [len(p) for p in parts] == [4 // grad_accum] * 2 * grad_accum
        assert torch.equal(torch.cat(parts), whole)


def test_a_batch_that_does_not_split_is_a_clear_error(tiny_corpus, tmp_path):
    result = qkov_cli(*train_args(tiny_corpus, tmp_path / "run", "--batch-size", "6", "--grad-accum", "4"))
    assert result.returncode == 2 and "does not split into 1 process(es) x 4" in result.stderr
    assert not (tmp_path / "run").exists()


def interrupt_when(path, args):
    """Start ``qkov train`` in its own process group and send the group Ctrl-C (SIGINT, as a terminal
    does) once ``path`` exists; returns the exit status and stderr."""
    process = subprocess.Popen(
        [sys.executable, "-m", "qkov", *args], stderr=subprocess.PIPE, text=True, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    # Ctrl-C as a terminal's foreground job has it: a test run that is itself a background job of a
    # non-interactive shell inherits SIGINT ignored, and so would the command
    deadline = time.time() + 120
    while not path.exists() and time.time() < deadline and process.poll() is None:
        time.sleep(0.002)
    os.killpg(process.pid, signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    return process.returncode, stderr


@pytest.mark.slow
def test_two_processes_match_one_and_resume_with_one(tiny_corpus, tmp_path):
    two = qkov_cli(*train_args(tiny_corpus, tmp_path / "two", "--nproc", "2"))
    assert two.returncode == 0, two.stderr
    one = qkov_cli(*train_args(tiny_corpus, tmp_path / "one"))
    accumulated = qkov_cli(*train_args(tiny_corpus, tmp_path / "accumulated", "--grad-accum", "2"))
    assert one.returncode == accumulated.returncode == 0, one.stderr + accumulated.stderr
    assert_close(tmp_path / "two", tmp_path / "one")
    assert_close(tmp_path / "two", tmp_path / "accumulated", atol=0)
    assert sorted(os.listdir(tmp_path / "two")) == sorted(os.listdir(tmp_path / "one"))
    logged = [json.loads(r)["step"] for r in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()]
    # each evaluation logged once, by rank 0: 10, 13, 16, 20, 25, 30, 32, 40, 50
    assert logged == sorted(TrainConfig(steps=50, batch_size=1, lr=1.0, eval_every=10).evaluation_steps())

    stopped = tmp_path / "stopped"
    status, stderr = interrupt_when(
        stopped / "training_state.safetensors", train_args(tiny_corpus, stopped, "--nproc", "2")
    )
    assert status == 130, stderr
    assert "checkpoint saved. Continue with --resume" in stderr
    reached = int(load_state_step(stopped / "training_state.safetensors"))
    assert 0 < reached < 50, "the run was not interrupted mid-way; make it longer"
    assert not [f for f in os.listdir(stopped) if f.endswith(".tmp")]
    resumed = qkov_cli(*train_args(tiny_corpus, stopped, "--resume"))
    assert resumed.returncode == 0, resumed.stderr
    assert_close(stopped, tmp_path / "two")


def test_torchrun_runs_qkov_as_a_module():
    command = torchrun_command(4, ["train", "--nproc", "4", "--layers", "2", "--nproc=4", "--out", "x"])
    assert command[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert command[command.index("--nproc-per-node") + 1] == "4"
    assert command[-7:] == ["-m", "qkov", "train", "--layers", "2", "--out", "x"]
