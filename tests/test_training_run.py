"""The one training entry: a run's recipe and settings, the checks on resume, and one function that
``qkov train`` and ``qkov reproduce`` both train through (the same weights, bit for bit)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import qkov
from qkov.cli import main
from qkov.distributed import default_threads
from qkov.recipes import recipe
from qkov.reproduce import quick_recipe
from qkov.schedule import TrainConfig
from qkov.training_log import read_training_log
from qkov.training_run import (
    TRAIN_FLAGS,
    TrainingRun,
    check_resume_settings,
    settings_of,
    train,
)

TINY = {"d_model": 32, "n_heads": 2, "d_head": 16, "n_ctx": 32, "vocab_size": 300, "batch_size": 8,
        "lr": 1e-2, "steps": 20, "eval_every": 10, "precision": "fp32"}  # fmt: skip


def flags(settings):
    return [f"--{k.replace('_', '-')}={v}" for k, v in settings.items()]


@pytest.mark.parametrize("n_layers", [0, 1, 2])
def test_a_runs_settings_give_back_its_recipe(n_layers):
    for r in (recipe(n_layers), quick_recipe(n_layers).override(seed=3)):
        assert TrainingRun(Path("unused"), n_layers, settings=settings_of(r)).recipe() == r
    given = TrainingRun(Path("unused"), n_layers, settings={"d_model": 64, "steps": None}).recipe()
    assert given.model.d_model == 64 and given.train.steps == recipe(n_layers).train.steps
    assert set(TRAIN_FLAGS) <= set(settings_of(recipe(n_layers)))  # every flag is a recipe setting


def test_a_run_checks_its_process_count():
    with pytest.raises(qkov.QkovError, match="--nproc must be at least 1, got 0"):
        TrainingRun(Path("unused"), 1, nproc=0)


def test_threads_are_the_cores_shared_among_this_machines_processes(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert [default_threads(n) for n in (1, 3, 32)] == [16, 5, 1]
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # under torchrun: its count of local workers
    assert default_threads(1) == 4


def test_a_given_setting_that_contradicts_the_saved_run_is_an_error():
    cfg = qkov.Config(2, 4, 128, 32, 2048, 128)
    train_cfg = TrainConfig(steps=100, batch_size=8, lr=5e-3)
    check_resume_settings(
        {"layers": 2, "d_model": 128, "steps": None, "seed": 9, "eval_every": 3}, cfg, train_cfg
    )
    with pytest.raises(qkov.QkovError, match=r"^--d-model 64 contradicts the run being resumed \(128\)$"):
        check_resume_settings({"layers": 2, "d_model": 64}, cfg, train_cfg)
    with pytest.raises(qkov.QkovError, match=r"^--layers 1 contradicts the run being resumed \(2\)$"):
        check_resume_settings({"layers": 1}, cfg, train_cfg)
    with pytest.raises(qkov.QkovError, match=r"^--batch-size 16 contradicts"):
        check_resume_settings({"layers": 2, "batch_size": 16}, cfg, train_cfg)


def test_the_command_and_the_library_train_the_same_bits(tiny_corpus, tmp_path, capsys):
    run = TrainingRun(tmp_path / "lib", 1, settings=TINY, corpus=[str(tiny_corpus)])
    model = train(run, show_progress=False)
    printed = capsys.readouterr().err
    assert "corpus: 12 file(s)" in printed and "done: checkpoint in" in printed
    threads = str(torch.get_num_threads())
    cli = tmp_path / "cli"
    main(["train", "--layers", "1", "--corpus", str(tiny_corpus), *flags(TINY), "--out", str(cli), "--quiet",
          "--threads", threads])  # fmt: skip
    ours, theirs = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("lib", "cli"))
    assert ours.keys() == theirs.keys() and all((ours[k] == theirs[k]).all() for k in ours)
    assert model.cfg.n_layers == 1 and model.tokenizer is not None
    assert [p.step for p in read_training_log(tmp_path / "lib")] == [10, 13, 16, 20]


def test_resuming_a_finished_run_trains_nothing_and_checks_the_given_settings(tiny_corpus, tmp_path):
    out = tmp_path / "run"
    train(TrainingRun(out, 0, settings=TINY, corpus=[str(tiny_corpus)]), show_progress=False)
    before = (out / "model.safetensors").stat().st_mtime_ns
    resumed = train(TrainingRun(out, 0, corpus=[str(tiny_corpus)], resume=True), show_progress=False)
    assert (out / "model.safetensors").stat().st_mtime_ns == before  # the saved settings ruled
    assert resumed.cfg.d_model == 32
    with pytest.raises(qkov.QkovError, match="--steps 40 contradicts the run being resumed"):
        train(TrainingRun(out, 0, settings={"steps": 40}, corpus=[str(tiny_corpus)], resume=True))
    with pytest.raises(qkov.QkovError, match="already holds a training run; pass --resume"):
        train(TrainingRun(out, 0, settings=TINY, corpus=[str(tiny_corpus)]), show_progress=False)
