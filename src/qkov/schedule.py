"""The training schedule, as ``train_config.json`` holds it: steps, batch, the learning rate's
warm-up and decay, and when the model is evaluated (log-spaced, so that a window of training can be
placed on the papers' log-token axis; see :mod:`qkov.train`). Plain numbers, no torch: the command
line reads these settings before anything heavy is imported."""

from __future__ import annotations

import math
from dataclasses import dataclass

from qkov.errors import QkovError

EVAL_TOKENS = 32768  # held-out tokens scored at each evaluation, unless told otherwise
FIRST_LOG_EVAL = 10  # the first log-spaced evaluation step: the first few dozen steps are covered
SCHEDULES = ("cosine", "constant")


def log_spaced_steps(last: int, per_decade: int) -> set[int]:
    """Steps ``round(10 ** (k / per_decade))`` from ``FIRST_LOG_EVAL`` up to ``last``: evaluations
    at most ``1 / per_decade`` decades apart (none when ``per_decade`` is 0)."""
    if per_decade == 0:
        return set()
    first, stop = (math.floor(per_decade * math.log10(max(n, 1))) for n in (FIRST_LOG_EVAL, last))
    steps = (round(10 ** (k / per_decade)) for k in range(first, stop + 2))
    return {s for s in steps if FIRST_LOG_EVAL <= s <= last}


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings; written to ``train_config.json`` beside the checkpoint."""

    steps: int
    batch_size: int
    lr: float
    seed: int = 0
    warmup_steps: int | None = None  # default: 5% of the steps
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    eval_every: int = 100
    evals_per_decade: int = 10  # log-spaced evaluations (0: only every ``eval_every`` steps)
    eval_tokens: int = EVAL_TOKENS  # held-out tokens scored at each evaluation
    schedule: str = "cosine"  # after warm-up: cosine decay to min_lr_ratio * lr, or "constant"
    checkpoint_every: int = 500
    precision: str = "fp32"  # or "bf16": matmuls in bfloat16 under torch.autocast
    # W_E and W_pos start at unit scale (see qkov.model.init_weights), ~10x the scale of the
    # attention weights; Adam moves every entry by about lr, so they learn slower unless their
    # learning rate is scaled up.
    embed_lr_mult: float = 1.0

    def evaluation_steps(self) -> set[int]:
        """The steps after which the model is evaluated: log-spaced, every ``eval_every``, the last."""
        regular = set(range(self.eval_every, self.steps + 1, self.eval_every))
        return log_spaced_steps(self.steps, self.evals_per_decade) | regular | {self.steps}

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "eval_every", "eval_tokens", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise QkovError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise QkovError(f"learning rate must be positive, got {self.lr}")
        if self.precision not in ("fp32", "bf16"):
            raise QkovError(f"precision must be fp32 or bf16, got {self.precision!r}")
        if self.schedule not in SCHEDULES:
            raise QkovError(f"schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if self.evals_per_decade < 0:
            raise QkovError(f"evals_per_decade must be 0 or more, got {self.evals_per_decade}")

    @property
    def warmup(self) -> int:
        return self.warmup_steps if self.warmup_steps is not None else max(1, self.steps // 20)

    def lr_at(self, step: int) -> float:
        """Linear warm-up to ``lr``, then cosine decay to ``min_lr_ratio * lr`` at the last step (or
        ``lr`` to the end with the constant schedule)."""
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        if self.schedule == "constant":
            return self.lr
        progress = (step - self.warmup) / max(1, self.steps - self.warmup)
        cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
        return self.lr * (self.min_lr_ratio + (1 - self.min_lr_ratio) * cosine)
