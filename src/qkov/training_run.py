"""One training entry for every command: ``qkov train`` and ``qkov reproduce`` both describe a
:class:`TrainingRun` and call :func:`train`, which prepares the corpus (the one streaming pipeline
of :mod:`qkov.data.shards`: tokenizer trained on a bounded sample, tokens in cached shards), builds
the configs from the depth's recipe and the settings given on top of it, and runs the
:class:`qkov.train.Trainer` in this process, or in ``nproc`` processes under torchrun.

Resuming (``resume=True`` on a folder that holds a run): the saved configs and tokenizer rule; a
setting given explicitly that contradicts them is an error, whatever else the recipe says.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from safetensors import safe_open
from tokenizers import Tokenizer

from qkov.checkpoint import WEIGHTS_FILE, load_config, load_tokenizer
from qkov.config import Config
from qkov.data.shards import TokenShards, sampled_tokenizer, sharded_tokens
from qkov.data.sources import TEXT_FIELD, CorpusFiles
from qkov.distributed import launched_by_torchrun, process_group, run_workers
from qkov.errors import QkovError
from qkov.io import check_writable_folder
from qkov.machine import compute_device
from qkov.model import AttnOnlyTransformer
from qkov.recipes import Recipe, recipe
from qkov.schedule import TrainConfig
from qkov.sizes import check_model_size
from qkov.train import STATE_FILE, TRAIN_CONFIG_FILE, Trainer
from qkov.training_log import METRICS_FILE

console = Console(stderr=True)

#: The settings a run can give on top of its recipe (``qkov train``'s flags of the same names).
TRAIN_FLAGS = (
    "steps", "batch_size", "lr", "d_model", "n_heads", "d_head", "n_ctx", "vocab_size",
    "positional_embedding", "normalization", "d_mlp", "act_fn", "seed", "embed_lr_mult", "precision",
    "schedule", "eval_every", "evals_per_decade", "checkpoint_every",
)  # fmt: skip
#: The given settings a resumed run must agree with: ``(flag, saved key)``.
RESUME_CHECKED = (
    ("layers", "n_layers"), ("d_model", "d_model"), ("n_heads", "n_heads"), ("d_head", "d_head"),
    ("n_ctx", "n_ctx"), ("steps", "steps"), ("batch_size", "batch_size"), ("lr", "lr"),
    ("precision", "precision"), ("normalization", "normalization"), ("d_mlp", "d_mlp"),
    ("act_fn", "act_fn"),
)  # fmt: skip


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped the run after a checkpoint at ``step``; ``report`` is False in the processes
    that leave the telling to rank 0."""

    def __init__(self, step: int, report: bool = True) -> None:
        super().__init__(step)
        self.step, self.report = step, report


@dataclass(frozen=True)
class TrainingRun:
    """A model to train into ``out``: ``layers`` attention layers, the ``preset``'s recipe with the
    ``settings`` given on top (names of :data:`TRAIN_FLAGS`; None: not given), on the ``corpus``
    (files, folders or globs; None: the standard library). ``argv`` is the command line that
    ``nproc > 1`` relaunches under torchrun."""

    out: Path
    layers: int
    preset: str = "default"
    settings: Mapping[str, Any] = field(default_factory=dict)
    corpus: list[str] | None = None
    text_field: str = TEXT_FIELD
    device: str = "cpu"
    resume: bool = False
    grad_accum: int = 1
    compile: bool = False
    nproc: int = 1
    argv: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.nproc < 1:
            raise QkovError(f"--nproc must be at least 1, got {self.nproc}")

    def recipe(self) -> Recipe:
        """The recipe with the given settings in place; on a GPU, ``precision`` not given is bf16
        where the GPU has it."""
        settings = dict(self.settings) | {"n_layers": self.layers}
        if self.device != "cpu" and settings.get("precision") is None and torch.cuda.is_available():
            settings["precision"] = "bf16" if torch.cuda.is_bf16_supported() else "fp32"
        return recipe(self.layers, self.preset).override(**settings)


def settings_of(r: Recipe) -> dict[str, Any]:
    """Every setting of a recipe, by the names :meth:`Recipe.override` takes: a run given these
    trains exactly that recipe, and a resumed run must agree with all of them."""
    model = {("vocab_size" if k == "d_vocab" else k): v for k, v in dataclasses.asdict(r.model).items()}
    return model | dataclasses.asdict(r.train)


@dataclass(frozen=True)
class Prepared:
    cfg: Config
    train_cfg: TrainConfig
    data: TokenShards
    tokenizer: Tokenizer
    corpus: CorpusFiles


def prepare(run: TrainingRun, show_progress: bool = True) -> Prepared:
    """The configs (the saved ones on resume, else the recipe with the settings on top), the
    tokenizer and the sharded tokens of a run, and the corpus' files."""
    saved = run.out / TRAIN_CONFIG_FILE
    check_folder(run.out, run.resume)
    if not (run.resume and saved.exists()):  # the sizes before the corpus is read: weights, grads, AdamW's 2
        check_model_size(run.recipe().model, "train", copies=4)
    corpus = CorpusFiles.find(run.corpus, run.text_field)
    if run.resume and saved.exists():
        tokenizer = load_tokenizer(run.out)
        cfg = load_config(run.out)
        train_cfg = TrainConfig(**json.loads(saved.read_text()))
        check_resume_settings(dict(run.settings) | {"layers": run.layers}, cfg, train_cfg)
        if tokenizer is None:
            raise QkovError(f"{run.out}: the run to resume has no tokenizer.json")
    else:
        r = run.recipe()
        tokenizer = sampled_tokenizer(corpus, r.vocab_size)
        cfg, train_cfg = r.configs(tokenizer.get_vocab_size())
    data = sharded_tokens(corpus, tokenizer, show_progress)
    return Prepared(cfg, train_cfg, data, tokenizer, corpus)


def check_folder(out: Path, resume: bool) -> None:
    """Before any work: ``out`` writable, and holding no run (unless resumed) and no other checkpoint
    (:meth:`qkov.train.Trainer.open_folder` decides the same again, once the model is built)."""
    check_writable_folder(out)
    if (out / TRAIN_CONFIG_FILE).exists():
        if not resume:
            raise QkovError(f"{out} already holds a training run; pass --resume or choose another --out")
    elif (out / WEIGHTS_FILE).exists():
        raise QkovError(f"{out} already holds a checkpoint; choose another --out")


def check_resume_settings(given: Mapping[str, Any], cfg: Config, train_cfg: TrainConfig) -> None:
    """On resume the saved settings rule; a given one that contradicts them is an error."""
    saved = cfg.to_dict() | dataclasses.asdict(train_cfg)
    for flag, key in RESUME_CHECKED:
        value = given.get(flag)
        if value is not None and value != saved[key]:
            raise QkovError(
                f"--{flag.replace('_', '-')} {value} contradicts the run being resumed ({saved[key]})"
            )


def train(run: TrainingRun, show_progress: bool = True) -> AttnOnlyTransformer | None:
    """Prepare the corpus and train ``run`` (see the module docstring); the trained model (on the
    run's device), or None when it trained in torchrun's worker processes. Ctrl-C stops it after a
    checkpoint: :class:`TrainingInterrupted`."""
    if run.nproc > 1 and not launched_by_torchrun():
        prepare(run, show_progress)  # errors found here, once; the workers read the cached tokens
        launch_workers(run)
        return None
    with process_group(compute_device(run.device)) as processes:
        if not processes.is_main:  # the cache is filled by rank 0 first, read by the others
            processes.barrier()
        p = prepare(run, show_progress and processes.is_main)
        if processes.is_main:
            processes.barrier()
        trainer = Trainer(
            p.cfg, p.train_cfg, p.data, run.out, p.tokenizer, run.device, run.grad_accum, compile=run.compile
        )
        say = console.print if processes.is_main else lambda *a: None
        say(
            f"corpus: {len(p.corpus.files)} file(s), {len(p.data.train):,} train / {len(p.data.eval):,} "
            f"eval tokens; vocabulary {p.cfg.d_vocab}"
        )
        say(f"model: {p.cfg}")
        say(
            f"training: {p.train_cfg.steps} steps x {p.train_cfg.batch_size} x {p.cfg.n_ctx} tokens, "
            f"lr {p.train_cfg.lr}, {p.train_cfg.precision}, {processes.world_size} process(es) x "
            f"{run.grad_accum} micro-batch(es) x {torch.get_num_threads()} threads"
        )
        try:
            model = trainer.run(resume=run.resume, show_progress=show_progress)
        except KeyboardInterrupt:
            raise TrainingInterrupted(trainer.step, processes.is_main) from None
        say(f"done: checkpoint in {run.out} (metrics in {run.out / METRICS_FILE})")
        return model


def launch_workers(run: TrainingRun) -> None:
    """Run the command in ``nproc`` processes under torchrun and wait for them. Ctrl-C reaches
    every worker (they share the terminal's process group); each stops after rank 0's checkpoint."""
    status, interrupted = run_workers(run.nproc, list(run.argv))
    if interrupted or status == 130:
        raise TrainingInterrupted(saved_step(run.out / STATE_FILE))
    if status:
        raise QkovError(f"training processes failed (torchrun exit status {status}); see above")


def saved_step(file: Path) -> int:
    """The step of the training state in ``file`` (0 when none was saved yet)."""
    if not file.exists():
        return 0
    with safe_open(str(file), framework="pt") as f:
        return int(f.metadata()["step"])
