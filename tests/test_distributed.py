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

import qkov
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
    assert command[:3] == [sys.executable, "-m", "qkov.distributed"]  # torchrun, its own report left out
    assert command[command.index("--nproc-per-node") + 1] == "4"
    assert command[-7:] == ["-m", "qkov", "train", "--layers", "2", "--out", "x"]


SPLIT_STEPS = "spectra,copying,copying_direct"


@pytest.mark.slow
def test_two_processes_analyse_a_share_of_the_layers_each_and_give_one_process_results(tmp_path):
    """``qkov analyze --weights-only --nproc 2``: each process reads every other layer for spectra and
    eigenvalue and direct copying, and the results are those of one process, number for number
    (each layer's computation is the same wherever it runs, on one thread each)."""
    from conftest import random_model

    cfg = qkov.Config(n_layers=5, n_heads=3, d_model=24, d_head=8, d_vocab=70, n_ctx=16, normalization="RMS")
    qkov.save(random_model(cfg, seed=4), tmp_path / "model")
    common = ["analyze", str(tmp_path / "model"), "--weights-only", "--steps", SPLIT_STEPS, "--quiet"]
    one = qkov_cli(*common, "--threads", "1", "--out", str(tmp_path / "one"))
    two = qkov_cli(*common, "--nproc", "2", "--out", str(tmp_path / "two"))
    assert one.returncode == 0 and two.returncode == 0, two.stderr[-2000:]
    ours, theirs = (json.loads((tmp_path / name / "results.json").read_text()) for name in ("one", "two"))
    for step in ("spectra", "copying", "copying_direct"):
        assert ours[step] is not None and ours[step] == theirs[step], step
    assert len(ours["spectra"]["OV"]) == 15


def test_the_layers_are_shared_round_the_processes():
    from qkov.distributed import layer_share

    shares = [list(layer_share(5, Processes(rank, 2))) for rank in range(2)]
    assert shares == [[0, 2, 4], [1, 3]]
    assert list(layer_share(3, Processes())) == [0, 1, 2]
    assert Processes().gather_layers({0: "a", 1: "b"}, 2) == ["a", "b"]


def test_nproc_needs_weights_only_and_a_positive_count(tmp_path):
    for extra, message in (
        (["--nproc", "2"], "use it with --weights-only"),
        (["--nproc", "0"], "at least 1"),
    ):
        result = qkov_cli("analyze", str(tmp_path), *extra)
        assert result.returncode == 2 and message in result.stderr


def test_each_process_reads_and_computes_only_its_layers(monkeypatch):
    """Rank 1 of 2 computes layers 1 and 3 of 5, and asks the group for the others."""
    from qkov.circuits import qk_ov

    from conftest import random_model

    asked = []

    class Second(Processes):
        def gather_layers(self, own, n_layers):
            asked.append(sorted(own))
            return [own.get(layer) for layer in range(n_layers)]

    monkeypatch.setattr(qk_ov, "current_processes", lambda: Second(rank=1, world_size=2))
    cfg = qkov.Config(n_layers=5, n_heads=2, d_model=16, d_head=4, d_vocab=20, n_ctx=8)
    got = qk_ov.map_layers(random_model(cfg), "OV", lambda layer, full: (layer, full.shape))
    assert asked == [[1, 3]]
    assert got == [None, (1, (1, 2, 20, 20)), None, (3, (1, 2, 20, 20)), None]


def test_a_broken_checkpoint_is_one_line_before_any_process_starts(tmp_path):
    from conftest import random_model

    cfg = qkov.Config(n_layers=2, n_heads=2, d_model=16, d_head=4, d_vocab=20, n_ctx=8)
    qkov.save(random_model(cfg), tmp_path / "model")
    weights = tmp_path / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    result = qkov_cli("analyze", str(tmp_path / "model"), "--weights-only", "--nproc", "2")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.count("truncated or corrupt") == 1


def test_a_worker_that_fails_is_one_line_and_the_others_stop_without_a_traceback(tmp_path):
    """A fault that only a worker finds (a layer's weight that is NaN: the checkpoint's check
    before the processes start reads the ends alone): that worker says it in one line, the other
    says in one line that it cannot go on (or nothing, when torchrun stopped it first), and neither
    torchrun's report nor a traceback follows."""
    from safetensors.torch import save_file

    from conftest import random_model

    cfg = qkov.Config(n_layers=2, n_heads=2, d_model=16, d_head=4, d_vocab=20, n_ctx=8)
    qkov.save(random_model(cfg), tmp_path / "model")
    weights = tmp_path / "model" / "model.safetensors"
    tensors = load_file(weights)
    tensors["blocks.1.attn.W_V"][0, 0, 0] = torch.nan
    save_file(tensors, weights)
    result = qkov_cli("analyze", str(tmp_path / "model"), "--weights-only", "--nproc", "2")
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert "Traceback" not in result.stderr and "ChildFailedError" not in result.stderr
    errors = [line for line in lines if line.startswith("qkov: error: ")]
    assert sum("blocks.1.attn.W_V has non-finite values" in line for line in errors) == 1
    # the other worker says it cannot go on when it meets the failed one at a collective; torchrun
    # may stop it before then (it stops the others once one has failed), and then it says nothing
    assert sum("another analysis process stopped" in line for line in errors) <= 1
    assert errors[-1].startswith("qkov: error: analysis processes failed")
    assert not any("torch/distributed/elastic" in line for line in lines)
