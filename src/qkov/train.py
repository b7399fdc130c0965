"""Training an attention-only transformer on a token array, resumably and reproducibly.

AdamW with linear warm-up, then cosine decay (or a constant rate: ``schedule="constant"``,
TransformerLens' trainer schedule), and gradient clipping. The batch of step ``s`` depends
only on ``(seed, s)``, and a checkpoint holds the weights and the optimizer state in one atomically
written file (``training_state.safetensors``), so a run killed at any moment and resumed with
``resume=True`` ends with exactly the weights of an uninterrupted run.

The batch of step ``s`` is drawn whole (``batch_size`` windows, the global batch) whatever the
number of processes; under torchrun (:mod:`qkov.distributed`) each process trains on its slice of
it, DistributedDataParallel averages the gradients, and rank 0 alone evaluates and writes. With
the same seed, threads and processes on a CPU the weights are the same bits run after run.

At each evaluation rank 0 appends a row to ``metrics.jsonl`` (:mod:`qkov.training_log`), so the
induction phase change ("In-context Learning and Induction Heads", Olsson et al. 2022) can be read
off it: ``step``, ``tokens``, ``train_loss`` (the mean over the steps since the last evaluation) and
the fields :func:`qkov.evaluation.evaluate` measures (the held-out loss, by position, the
in-context-learning score, the loss on repeated random tokens and the best head scores), on inputs
drawn once per run (:func:`qkov.evaluation.evaluation_inputs`; a checkpoint series measures
checkpoints by the same function).

Evaluations are log-spaced, ``evals_per_decade`` per decade of steps from step
``FIRST_LOG_EVAL`` on, so a window of training can be placed on the papers' log-token axis to within
half a spacing; ``eval_every`` adds evenly spaced ones, and the last step is always evaluated.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import torch
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from tokenizers import Tokenizer
from torch.nn.parallel import DistributedDataParallel

from qkov import distributed
from qkov.checkpoint import (
    CONFIG_FILE,
    TOKENIZER_FILE,
    WEIGHTS_FILE,
    model_from_tensors,
    save,
)
from qkov.config import Config
from qkov.data.shards import TokenShards
from qkov.data.tokens import TokenSplits, window_starts, windows_at
from qkov.errors import QkovError
from qkov.evaluation import evaluate, evaluation_inputs
from qkov.io import atomic_write_text
from qkov.machine import compute_device
from qkov.model import AttnOnlyTransformer, init_weights
from qkov.schedule import TrainConfig
from qkov.tensorfile import read_tensor_file, write_tensors
from qkov.training_log import METRICS_FILE, TrainingPoint, append_training_point, truncate_training_log

STATE_FILE = "training_state.safetensors"
TRAIN_CONFIG_FILE = "train_config.json"


def step_generator(seed: int, step: int) -> torch.Generator:
    """The random source of one step's batch: a function of the seed and the step alone."""
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


class StopRequest:
    """Turns Ctrl-C into a request that the loop honours between steps, after a checkpoint, so an
    interrupted run is always resumable from the step it reached."""

    def __init__(self) -> None:
        self.requested = False
        self.previous = None

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self.request)
        return self

    def request(self, signum: int, frame: object) -> None:
        self.requested = True

    def __exit__(self, *exc: object) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


class NextTokenLoss(torch.nn.Module):
    """``model.loss`` as a module's ``forward``, the call DistributedDataParallel wraps."""

    def __init__(self, model: AttnOnlyTransformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, windows: torch.Tensor) -> torch.Tensor:
        return self.model.loss(windows)


class Trainer:
    """One training run writing into ``out``; see the module docstring.

    ``cfg`` is the model's config, ``train_cfg`` the optimisation's. Under torchrun (see
    :mod:`qkov.distributed`) each of the ``world_size`` processes computes the gradient of its
    slice of every step's global batch, in ``grad_accum`` micro-batches; rank 0 alone evaluates
    and writes. Neither the number of processes nor ``grad_accum`` is part of the run: a run can
    be resumed with other values (the result then differs only by float rounding).
    ``compile=True`` runs the training step's model through ``torch.compile`` (not part of the run
    either; benchmarks/gpu_train.py measures whether it pays).
    """

    def __init__(
        self,
        cfg: Config,
        train_cfg: TrainConfig,
        data: TokenSplits | TokenShards,
        out: str | os.PathLike,
        tokenizer: Tokenizer | None = None,
        device: str = "cpu",
        grad_accum: int = 1,
        compile: bool = False,
    ) -> None:
        self.cfg, self.train_cfg, self.data, self.out = cfg, train_cfg, data, Path(out)
        self.processes = distributed.current()
        self.device = distributed.worker_device(compute_device(device), self.processes)
        self.tokenizer = tokenizer
        self.grad_accum = grad_accum
        self.compile = compile
        parts = self.processes.world_size * grad_accum
        if grad_accum < 1 or train_cfg.batch_size % parts:
            raise QkovError(
                f"batch size {train_cfg.batch_size} does not split into {self.processes.world_size} "
                f"process(es) x {grad_accum} micro-batch(es); choose a multiple of {parts}"
            )
        if len(data.train) < cfg.n_ctx + 1:
            raise QkovError(
                f"corpus has {len(data.train)} training tokens, fewer than one window of n_ctx + 1 = "
                f"{cfg.n_ctx + 1}; use a larger corpus or a smaller --n-ctx"
            )
        self.model = AttnOnlyTransformer(cfg)
        self.model.tokenizer = tokenizer
        init_weights(self.model, torch.Generator().manual_seed(train_cfg.seed))
        self.model.to(self.device)
        embeddings = {"W_E", "W_pos"}
        params = dict(self.model.named_parameters())
        groups = [
            {"params": [p for n, p in params.items() if n in embeddings], "lr_mult": train_cfg.embed_lr_mult},
            {"params": [p for n, p in params.items() if n not in embeddings], "lr_mult": 1.0},
        ]
        self.optimizer = torch.optim.AdamW(
            groups, lr=train_cfg.lr, betas=(0.9, 0.95), weight_decay=train_cfg.weight_decay
        )
        self.step = 0
        self.losses_since_eval: list[float] = []
        self.autocast = torch.autocast(
            self.device.type, dtype=torch.bfloat16, enabled=train_cfg.precision == "bf16"
        )
        self.eval_inputs = evaluation_inputs(cfg, data.eval, train_cfg.eval_tokens, train_cfg.seed).to(
            self.device
        )

    # -- checkpoints -----------------------------------------------------------------------------
    def state_tensors(self) -> dict[str, torch.Tensor]:
        tensors = {f"model.{n}": p.detach().contiguous().cpu() for n, p in self.model.named_parameters()}
        names = {id(p): n for n, p in self.model.named_parameters()}
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                for key, value in self.optimizer.state.get(p, {}).items():
                    tensors[f"optim.{names[id(p)]}.{key}"] = torch.as_tensor(value).contiguous().cpu()
        return tensors

    def save_checkpoint(self) -> None:
        """The training state first (weights and optimizer in one atomic file, the step in its
        metadata), then the user-facing checkpoint: a run killed at any moment can be resumed."""
        tensors = self.state_tensors()
        meta = {
            "step": str(self.step),
            "config": self.cfg.to_json(),
            "losses_since_eval": json.dumps(self.losses_since_eval),
        }
        write_tensors(self.out / STATE_FILE, tensors, meta)
        save(self.model, self.out, self.tokenizer)

    def start_folder(self) -> None:
        """Mark ``out`` as this run's folder before the first step: the model config, the tokenizer
        and, last, ``train_config.json`` (whose presence makes the folder resumable)."""
        self.out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.out / CONFIG_FILE, self.cfg.to_json())
        if self.tokenizer is not None:
            atomic_write_text(self.out / TOKENIZER_FILE, self.tokenizer.to_str())
        atomic_write_text(
            self.out / TRAIN_CONFIG_FILE, json.dumps(dataclasses.asdict(self.train_cfg), indent=2) + "\n"
        )

    def load_checkpoint(self) -> None:
        file = self.out / STATE_FILE
        tensors, meta = read_tensor_file(file)
        if Config.from_dict(json.loads(meta.get("config", "{}"))) != self.cfg:
            raise QkovError(f"{file}: checkpoint was trained with another model config; use another --out")
        weights = {n[len("model.") :]: t for n, t in tensors.items() if n.startswith("model.")}
        loaded = model_from_tensors(self.cfg, weights, str(file))
        self.model.load_state_dict(loaded.state_dict())
        params = dict(self.model.named_parameters())
        for name, tensor in tensors.items():
            if name.startswith("optim."):
                pname, key = name[len("optim.") :].rsplit(".", 1)
                param = params[pname]  # AdamW keeps its step counter on the CPU, the moments by the weights
                self.optimizer.state[param][key] = (
                    tensor.clone() if key == "step" else tensor.to(param.device)
                )
        self.step = int(meta["step"])
        # the losses of the steps since the last evaluation, so that the next row's train_loss
        # averages the same steps as an uninterrupted run's (absent in older states: none)
        self.losses_since_eval = [float(x) for x in json.loads(meta.get("losses_since_eval", "[]"))]
        if self.processes.is_main:
            truncate_training_log(self.out, self.step)

    # -- evaluation ------------------------------------------------------------------------------
    def evaluate(self) -> dict[str, float | list[float]]:
        self.model.eval()
        with self.autocast:
            metrics = evaluate(self.model, self.eval_inputs)
        self.model.train()
        return metrics

    # -- the loop --------------------------------------------------------------------------------
    def open_folder(self, resume: bool) -> bool:
        """Start ``out`` or continue the run in it. Every process checks the folder before rank 0
        writes anything (so all come to the same decision); each reads the checkpoint. Returns
        whether the folder was started here."""
        if (self.out / TRAIN_CONFIG_FILE).exists():
            if not resume:
                raise QkovError(
                    f"{self.out} already holds a training run; pass --resume or choose another --out"
                )
            has_state = (self.out / STATE_FILE).exists()
            self.processes.barrier()
            if has_state:
                self.load_checkpoint()
            elif self.processes.is_main:  # stopped before its first checkpoint: start again from step 0
                truncate_training_log(self.out, self.step)
            return False
        if (self.out / WEIGHTS_FILE).exists():
            raise QkovError(f"{self.out} already holds a checkpoint; choose another --out")
        self.processes.barrier()
        if self.processes.is_main:
            self.start_folder()
        return True

    def micro_batches(self, step: int) -> list[torch.Tensor]:
        """This process' share of step ``step``'s global batch, in ``grad_accum`` micro-batches.

        The global batch's window offsets are drawn from ``(seed, step)`` alone, so the same
        windows are trained on whatever the number of processes."""
        seq, per_process = self.cfg.n_ctx + 1, self.train_cfg.batch_size // self.processes.world_size
        starts = window_starts(
            len(self.data.train), self.train_cfg.batch_size, seq, step_generator(self.train_cfg.seed, step)
        )
        mine = starts[self.processes.rank * per_process : (self.processes.rank + 1) * per_process]
        size = per_process // self.grad_accum
        return [
            windows_at(self.data.train, mine[i : i + size], seq).to(self.device)
            for i in range(0, per_process, size)
        ]

    def train_step(self, loss_module: torch.nn.Module, stop_requested: bool) -> tuple[float, bool]:
        """One optimizer step on the global batch; returns its mean loss and whether any process
        asked to stop (one all-reduce carries both)."""
        for group in self.optimizer.param_groups:
            group["lr"] = self.train_cfg.lr_at(self.step) * group["lr_mult"]
        batches = self.micro_batches(self.step)
        total = torch.zeros((), device=self.device)
        for i, windows in enumerate(batches):
            last = i == len(batches) - 1
            sync = (
                contextlib.nullcontext() if last or not self.processes.distributed else loss_module.no_sync()
            )
            with sync:
                with self.autocast:
                    loss = loss_module(windows) / len(batches)
                loss.backward()
            total += loss.detach().float()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.train_cfg.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        shared = self.processes.all_reduce_sum(
            torch.stack([total, torch.tensor(float(stop_requested), device=self.device)])
        )
        return float(shared[0]) / self.processes.world_size, bool(shared[1] > 0)

    def run(self, resume: bool = False, show_progress: bool = True) -> AttnOnlyTransformer:
        """Train to the last step (see the module docstring). A fresh run that fails before its
        first checkpoint removes what it wrote, so the corrected rerun is not refused."""
        started = self.open_folder(resume)
        try:
            return self.train_loop(show_progress)
        except Exception:
            if started and self.processes.is_main and not (self.out / STATE_FILE).exists():
                self.undo_start()
            raise

    def undo_start(self) -> None:
        """Remove the files :meth:`start_folder` wrote (and a first metrics row), and the folder
        when that leaves it empty."""
        for name in (TRAIN_CONFIG_FILE, CONFIG_FILE, TOKENIZER_FILE, METRICS_FILE):
            (self.out / name).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self.out.rmdir()

    def train_loop(self, show_progress: bool) -> AttnOnlyTransformer:
        cfg, main = self.train_cfg, self.processes.is_main
        tokens_per_step = cfg.batch_size * self.cfg.n_ctx
        loss_module: torch.nn.Module = NextTokenLoss(self.model)
        if self.processes.distributed:
            loss_module = DistributedDataParallel(
                loss_module, device_ids=[self.device.index] if self.device.type == "cuda" else None
            )
        if self.compile:
            loss_module = torch.compile(loss_module)
        columns = (
            TextColumn("[bold]step {task.completed}/{task.total}"),
            BarColumn(),
            TextColumn("loss {task.fields[loss]}  eval {task.fields[eval]}  {task.fields[tps]} tok/s"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
        )
        losses = self.losses_since_eval
        evaluation_steps = cfg.evaluation_steps()
        with (
            Progress(*columns, disable=not (show_progress and main), transient=False) as progress,
            StopRequest() as stop,
        ):
            task = progress.add_task(
                "train", total=cfg.steps, completed=self.step, loss="-", eval="-", tps="-"
            )
            while self.step < cfg.steps:
                started = time.perf_counter()
                loss, stopping = self.train_step(loss_module, stop.requested)
                losses.append(loss)
                if not math.isfinite(loss):
                    raise QkovError(f"training diverged at step {self.step} (loss {loss}); lower --lr")
                tps = tokens_per_step / (time.perf_counter() - started)
                progress.update(
                    task, completed=self.step, loss=f"{np.mean(losses[-20:]):.3f}", tps=f"{tps:,.0f}"
                )
                if main and self.step in evaluation_steps:
                    point = TrainingPoint(
                        self.step, self.step * tokens_per_step, float(np.mean(losses)), **self.evaluate()
                    )
                    append_training_point(self.out, point)
                    progress.update(task, eval=f"{point.eval_loss:.3f}")
                if self.step in evaluation_steps:
                    losses.clear()
                if main and (self.step % cfg.checkpoint_every == 0 or self.step == cfg.steps or stopping):
                    self.save_checkpoint()
                if stopping:
                    self.processes.barrier()  # no process exits before rank 0's checkpoint is written
                    raise KeyboardInterrupt
        self.processes.barrier()
        return self.model
