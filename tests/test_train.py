"""Training: the loss falls, metrics are logged, and a killed run resumes bit for bit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import qkov
from qkov.data.shards import sampled_tokenizer, sharded_tokens
from qkov.data.sources import CorpusFiles
from qkov.data.tokens import TokenSplits
from qkov.evaluation import icl_positions
from qkov.schedule import TrainConfig, log_spaced_steps
from qkov.train import STATE_FILE, NextTokenLoss, Trainer
from qkov.training_log import read_training_log

from conftest import random_model

TINY = [
    "--d-model",
    "32",
    "--n-heads",
    "2",
    "--d-head",
    "16",
    "--n-ctx",
    "32",
    "--vocab-size",
    "300",
    "--batch-size",
    "8",
    "--lr",
    "1e-2",
    "--threads",
    "1",
    "--quiet",
    "--precision",
    "fp32",
]


def qkov_cli(*args, **kwargs):
    return subprocess.run(
        [sys.executable, "-m", "qkov.cli", *args],
        capture_output=True,
        text=True,
        env=os.environ | {"PYTHONUNBUFFERED": "1"},
        **kwargs,
    )


def tiny_run(tiny_corpus, out, n_layers=2, **train):
    corpus = CorpusFiles.find([str(tiny_corpus)])
    tokenizer = sampled_tokenizer(corpus, 300)
    cfg = qkov.Config(n_layers, 2, 32, 16, tokenizer.get_vocab_size(), 32)
    train_cfg = TrainConfig(**({"steps": 60, "batch_size": 8, "lr": 1e-2, "eval_every": 20} | train))
    return Trainer(cfg, train_cfg, sharded_tokens(corpus, tokenizer, show_progress=False), out, tokenizer)


def test_training_lowers_the_loss_and_logs_metrics(tiny_corpus, tmp_path):
    trainer = tiny_run(tiny_corpus, tmp_path / "run")
    trainer.run(show_progress=False)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # 10 log-spaced evaluations per decade from step 10, and every 20 steps
    assert [r["step"] for r in rows] == [10, 13, 16, 20, 25, 32, 40, 50, 60]
    assert list(rows[0]) == [
        "step", "tokens", "train_loss", "eval_loss", "loss_by_position", "icl_score", "icl_score_se",
        "repeat_loss_first", "repeat_loss_second", "induction_score", "previous_token_score",
    ]  # fmt: skip
    assert all(round(r["train_loss"], 5) == r["train_loss"] for r in rows)  # floats to 5 decimals
    assert read_training_log(tmp_path / "run")[-1].eval_loss == rows[-1]["eval_loss"]
    assert rows[3]["tokens"] == 20 * 8 * 32
    assert rows[-1]["eval_loss"] < rows[0]["eval_loss"] < 6.0  # log(300) = 5.7 is chance
    assert {"repeat_loss_first", "repeat_loss_second", "induction_score", "previous_token_score"} <= set(
        rows[0]
    )
    for row in rows:  # the held-out loss at each of the 32 positions; the ICL score from two of them
        assert len(row["loss_by_position"]) == 32
        assert row["eval_loss"] == pytest.approx(np.mean(row["loss_by_position"]), abs=1e-4)
        early, late = icl_positions(32)
        assert (early, late) == (2, 16)
        icl = row["loss_by_position"][late] - row["loss_by_position"][early]
        assert row["icl_score"] == pytest.approx(icl, abs=2e-4)
    model = qkov.load(tmp_path / "run")
    assert model.tokenizer is not None and model.cfg.n_layers == 2


def test_metrics_follow_their_definitions(tiny_corpus, tmp_path):
    """The logged metrics recomputed independently from the trained model: the per-position
    held-out loss by a plain forward pass, the loss per repeat by slicing that every repeat's first
    token is left out of."""
    trainer = tiny_run(tiny_corpus, tmp_path / "run", steps=20)
    trainer.run(show_progress=False)
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    windows = trainer.eval_inputs.windows
    with torch.no_grad():
        logits = trainer.model(windows[:, :-1])
        per_position = torch.nn.functional.cross_entropy(
            logits.transpose(1, 2), windows[:, 1:], reduction="none"
        )
        tokens = trainer.eval_inputs.repeated
        losses = torch.nn.functional.cross_entropy(
            trainer.model(tokens)[:, :-1].transpose(1, 2), tokens[:, 1:], reduction="none"
        ).mean(0)
    np.testing.assert_allclose(row["loss_by_position"], per_position.mean(0).numpy(), atol=1e-4)
    early, late = icl_positions(32)  # the ICL score's standard error: its spread over the blocks
    block = trainer.eval_inputs.block
    per_block = (per_position[:, late] - per_position[:, early]).double().reshape(-1, block).sum(1)
    se = float(per_block.std()) * len(per_block) ** 0.5 / len(windows)
    assert row["icl_score_se"] == pytest.approx(se, abs=1e-5)
    assert len(windows) > 30 and block > 1 and row["icl_score_se"] > 0
    period = trainer.eval_inputs.period  # 16: tokens 1..15 of the first copy, 17..31 of the second
    assert row["repeat_loss_first"] == pytest.approx(float(losses[0:15].mean()), abs=1e-4)
    assert row["repeat_loss_second"] == pytest.approx(float(losses[16:31].mean()), abs=1e-4)
    assert period == 16


def test_one_layer_model_logs_its_repeat_metrics_too(tiny_corpus, tmp_path):
    """The 1-layer model is the phase change's control: it logs the same scores."""
    tiny_run(tiny_corpus, tmp_path / "run", n_layers=1, steps=20).run(show_progress=False)
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert {"repeat_loss_first", "induction_score", "icl_score", "loss_by_position"} <= set(row)


def test_zero_layer_model_logs_no_repeat_metrics(tiny_corpus, tmp_path):
    tiny_run(tiny_corpus, tmp_path / "run", n_layers=0, steps=20).run(show_progress=False)
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert "repeat_loss_first" not in row and "icl_score" in row


def test_learning_rate_schedule_warms_up_and_decays():
    cfg = TrainConfig(steps=100, batch_size=1, lr=1.0, warmup_steps=10)
    assert cfg.lr_at(0) == pytest.approx(0.1) and cfg.lr_at(9) == pytest.approx(1.0)
    assert cfg.lr_at(10) == pytest.approx(1.0) and cfg.lr_at(100) == pytest.approx(0.1)
    assert cfg.lr_at(55) == pytest.approx(0.55)


def test_constant_schedule_keeps_the_rate_after_warm_up():
    cfg = TrainConfig(steps=100, batch_size=1, lr=1.0, warmup_steps=10, schedule="constant")
    assert cfg.lr_at(4) == pytest.approx(0.5)
    assert [cfg.lr_at(s) for s in (10, 55, 100)] == [1.0, 1.0, 1.0]
    with pytest.raises(qkov.QkovError, match="schedule must be one of cosine, constant"):
        TrainConfig(steps=10, batch_size=1, lr=1.0, schedule="linear")


def test_evaluations_are_log_spaced_at_most_a_tenth_of_a_decade_apart():
    steps = sorted(TrainConfig(steps=24000, batch_size=1, lr=1.0, eval_every=10**6).evaluation_steps())
    assert steps[0] == 10 and steps[-1] == 24000
    gaps = np.diff(np.log10(steps))
    assert gaps.max() < 0.115 and len(steps) == 35  # integer steps: 10 -> 13 is 0.11 decades
    assert gaps[steps.index(40) :].max() < 0.103  # from step 40 on, 0.1 decades up to rounding
    assert sorted(log_spaced_steps(100, 5)) == [10, 16, 25, 40, 63, 100]
    assert log_spaced_steps(100, 0) == set()


def test_a_second_run_into_the_same_folder_needs_resume(tiny_corpus, tmp_path):
    tiny_run(tiny_corpus, tmp_path / "run", steps=5).run(show_progress=False)
    with pytest.raises(qkov.QkovError, match="--resume"):
        tiny_run(tiny_corpus, tmp_path / "run", steps=5).run(show_progress=False)


def weights(folder):
    return load_file(str(folder / "model.safetensors"))


def kill_when(path, args):
    """Start a training run, SIGKILL it as soon as ``path`` exists, and wait for it to die."""
    victim = subprocess.Popen(
        [sys.executable, "-m", "qkov.cli", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.time() + 120
    while not path.exists() and time.time() < deadline and victim.poll() is None:
        time.sleep(0.002)
    victim.send_signal(signal.SIGKILL)
    victim.wait()


@pytest.mark.slow
def test_a_run_killed_with_sigkill_resumes_to_identical_weights(tiny_corpus, tmp_path):
    steps = ["--steps", "400", "--checkpoint-every", "10", "--eval-every", "50"]
    common = ["train", "--layers", "2", "--corpus", str(tiny_corpus), *TINY, *steps]
    reference = qkov_cli(*common, "--out", str(tmp_path / "straight"))
    assert reference.returncode == 0, reference.stderr

    killed = tmp_path / "killed"
    args = [*common, "--out", str(killed), "--resume"]
    kill_when(killed / "train_config.json", args)  # killed at its start (usually before a checkpoint)
    kill_when(killed / STATE_FILE, args)  # killed mid-way, just after a checkpoint
    reached = int(load_state_step(killed / STATE_FILE))
    assert 0 < reached < 400, "the run was not interrupted mid-way; make it longer"

    resumed = qkov_cli(*args)
    assert resumed.returncode == 0, resumed.stderr
    ours, theirs = weights(killed), weights(tmp_path / "straight")
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert torch.equal(ours[name], theirs[name]), name
    steps_logged = [json.loads(r)["step"] for r in (killed / "metrics.jsonl").read_text().splitlines()]
    expected = TrainConfig(steps=400, batch_size=1, lr=1.0, eval_every=50).evaluation_steps()
    assert steps_logged == sorted(expected)  # each evaluation once: no line from a killed attempt
    assert steps_logged[:3] == [10, 13, 16] and steps_logged[-2:] == [398, 400]


def load_state_step(file):
    from safetensors import safe_open

    with safe_open(str(file), framework="pt") as f:
        return f.metadata()["step"]


def test_ctrl_c_saves_a_checkpoint_and_exits_130(tiny_corpus, tmp_path):
    out = tmp_path / "run"
    args = [
        "train",
        "--layers",
        "1",
        "--corpus",
        str(tiny_corpus),
        *TINY,
        "--steps",
        "100000",
        "--out",
        str(out),
    ]
    process = subprocess.Popen(
        [sys.executable, "-m", "qkov.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.time() + 120
    while not (out / "metrics.jsonl").exists() and time.time() < deadline:
        time.sleep(0.01)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130
    assert "Continue with --resume" in stderr
    step = int(load_state_step(out / STATE_FILE))
    assert step >= 10  # the first evaluation (at step 10) wrote metrics.jsonl before the interrupt
    assert qkov.load(out).cfg.n_layers == 1


def test_a_layer_norm_mlp_model_trains_from_the_command_line(tiny_corpus, tmp_path):
    """The same trainer runs GPT-2-style configs: LayerNorm, an MLP, GELU."""
    out = tmp_path / "ln"
    gpt2_style = [
        "--normalization",
        "LN",
        "--d-mlp",
        "64",
        "--act-fn",
        "gelu_new",
        "--positional-embedding",
        "standard",
    ]
    run = qkov_cli(
        "train", "--layers", "2", "--corpus", str(tiny_corpus), *TINY, *gpt2_style,
        "--steps", "60", "--eval-every", "20", "--out", str(out),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    model = qkov.load(out)
    assert (model.cfg.normalization, model.cfg.d_mlp, model.cfg.source) == ("LN", 64, "qkov")
    assert model.blocks[1].ln2 is not None and model.blocks[1].mlp.W_in.shape == (32, 64)
    losses = [json.loads(row)["eval_loss"] for row in (out / "metrics.jsonl").read_text().splitlines()]
    assert losses[-1] < losses[0] - 0.5


@pytest.mark.slow
def test_same_seed_and_threads_give_byte_identical_checkpoints(tmp_path):
    """At the default 2-layer size with 2 threads, where indexing's embedding backward made two runs
    differ (measured after 20, 50 and 200 steps; 1e-5 after 20), every weight and optimizer tensor
    and the model.safetensors file are the same bits run after run."""
    rng = np.random.default_rng(0)
    data = TokenSplits(*(rng.integers(0, 4096, n, dtype=np.uint16) for n in (100_000, 5000)))
    cfg = qkov.Config(2, 4, 128, 32, 4096, 128)
    train_cfg = TrainConfig(steps=50, batch_size=8, lr=5e-3, eval_every=1000, checkpoint_every=1000)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for run in ("a", "b"):
            Trainer(cfg, train_cfg, data, tmp_path / run).run(show_progress=False)
    finally:
        torch.set_num_threads(threads)
    model = tmp_path / "a" / "model.safetensors"
    assert model.read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()
    # the training state's header lists its metadata in a varying order: its tensors are compared
    ours, theirs = (load_file(str(tmp_path / run / STATE_FILE)) for run in ("a", "b"))
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert torch.equal(ours[name], theirs[name]), name


@pytest.mark.parametrize("n_layers", [0, 2])
def test_torch_compile_traces_the_training_step_in_one_graph(n_layers):
    """``qkov train --compile``: the loss module traces without a graph break (a break at the
    token range check printed a long warning and split the graph); the traced loss is the loss."""
    model = random_model(qkov.Config(n_layers, 2, 16, 8, 50, 12))
    windows = torch.randint(0, 50, (3, 13), generator=torch.Generator().manual_seed(0))
    explained = torch._dynamo.explain(NextTokenLoss(model))(windows)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    traced = torch.compile(NextTokenLoss(model), backend="eager")(windows)  # the graph, run as traced
    assert torch.allclose(traced, model.loss(windows))


class StopsAfter(Trainer):
    """A run whose Ctrl-C arrives during step ``stop_at``: it saves a checkpoint and stops there."""

    stop_at = 15

    def train_step(self, loss_module, stop_requested):
        return super().train_step(loss_module, stop_requested or self.step == self.stop_at - 1)


def test_resumed_metrics_log_equals_the_uninterrupted_one(tiny_corpus, tmp_path):
    """The first train_loss after a resume averages the steps since the last evaluation, those
    before the stop included (it averaged only the steps since the resume)."""
    settings = {"steps": 20, "eval_every": 10, "checkpoint_every": 100}
    tiny_run(tiny_corpus, tmp_path / "whole", **settings).run(show_progress=False)
    corpus = CorpusFiles.find([str(tiny_corpus)])
    tokenizer = sampled_tokenizer(corpus, 300)
    cfg = qkov.Config(2, 2, 32, 16, tokenizer.get_vocab_size(), 32)
    data = sharded_tokens(corpus, tokenizer, show_progress=False)
    train_cfg = TrainConfig(
        steps=20, batch_size=8, lr=1e-2, **{k: settings[k] for k in settings if k != "steps"}
    )
    with pytest.raises(KeyboardInterrupt):
        StopsAfter(cfg, train_cfg, data, tmp_path / "cut", tokenizer).run(show_progress=False)
    tiny_run(tiny_corpus, tmp_path / "cut", **settings).run(resume=True, show_progress=False)
    whole = (tmp_path / "whole" / "metrics.jsonl").read_text()
    assert (tmp_path / "cut" / "metrics.jsonl").read_text() == whole


def test_identical_runs_write_identical_training_state_bytes(tiny_corpus, tmp_path):
    """The training state's header keys are sorted (the safetensors writer's metadata map put them
    in another order run after run), and it carries its tensors' checksum."""
    for run in ("a", "b"):
        tiny_run(tiny_corpus, tmp_path / run, steps=3, eval_every=1000).run(show_progress=False)
    state = (tmp_path / "a" / STATE_FILE).read_bytes()
    assert state == (tmp_path / "b" / STATE_FILE).read_bytes()
    assert b'"qkov_sha256"' in state


def test_weight_files_get_the_usual_permissions(tiny_corpus, tmp_path):
    tiny_run(tiny_corpus, tmp_path / "run", steps=2, eval_every=1000).run(show_progress=False)
    umask = os.umask(0)
    os.umask(umask)
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "run").iterdir()}
    assert set(modes.values()) == {0o666 & ~umask}, modes


def test_a_run_that_fails_before_its_first_checkpoint_leaves_no_train_config(tiny_corpus, tmp_path):
    """Diverging at step 1 (a learning rate of 1e30) removes what the start wrote, so the corrected
    rerun is not refused as a second run into the folder."""
    with pytest.raises(qkov.QkovError, match="diverged"):
        tiny_run(tiny_corpus, tmp_path / "run", steps=5, lr=1e30, warmup_steps=0).run(show_progress=False)
    assert not (tmp_path / "run" / "train_config.json").exists()
    tiny_run(tiny_corpus, tmp_path / "run", steps=2).run(show_progress=False)
    assert (tmp_path / "run" / STATE_FILE).exists()


def test_a_tampered_training_state_is_refused_on_resume(tiny_corpus, tmp_path):
    tiny_run(tiny_corpus, tmp_path / "run", steps=2, eval_every=1000).run(show_progress=False)
    state = tmp_path / "run" / STATE_FILE
    data = bytearray(state.read_bytes())
    data[-5] ^= 0x40
    state.write_bytes(bytes(data))
    with pytest.raises(qkov.QkovError, match="checksum"):
        tiny_run(tiny_corpus, tmp_path / "run", steps=4, eval_every=1000).run(
            resume=True, show_progress=False
        )
