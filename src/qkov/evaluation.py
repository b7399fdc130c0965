"""The evaluation behind a row of the training log (:mod:`qkov.training_log`): what the trainer
measures at each evaluation and a checkpoint series (:mod:`qkov.series`) measures at each
checkpoint, by one function, :func:`evaluate`, on inputs drawn once by :func:`evaluation_inputs`.

- ``eval_loss`` and ``loss_by_position``: the held-out loss, and the loss of the prediction made at
  each position ``i`` (having seen tokens ``0 ... i``), on held-out windows of ``n_ctx + 1`` tokens;
- ``icl_score``: Olsson et al.'s in-context-learning score ("In-context Learning and Induction
  Heads", 2022), "the loss of the 500th token in the context minus the average loss of the 50th
  token" of a 1024-token context: ``loss_by_position[500] - loss_by_position[50]`` for every
  ``n_ctx >= 1024`` (position ``i`` counted from 0, its loss that of predicting token ``i + 1``
  having seen tokens ``0 ... i``); shorter contexts scale both positions by ``n_ctx / 1024``
  (:func:`icl_positions`: 6 and 62 at ``n_ctx`` 128); ``icl_score_se``: its standard error over
  the held-out windows, the precision of the score's value: every evaluation of a run reads the same
  windows, so what limits a change within the run is the scatter between evaluations instead
  (:func:`qkov.circuits.phase_change.noise`). The text windows overlap, in blocks of
  ``ICL_BLOCK`` that each start ``late - early`` tokens after the one before: the token a window
  predicts at the late position is the one the next window predicts at the early position, so the
  score compares the same tokens seen with a long and a short context, and the difficulty of the
  tokens themselves, most of the scatter of unpaired windows, cancels. The standard error is taken
  over the blocks (independent, at random offsets), each contributing its windows' summed score;
- for models with attention layers, the loss on the first and second repeat of random tokens
  (:func:`qkov.data.random_tokens.loss_per_repeat`, the definition ``analyze`` uses too) and the
  strongest induction and previous-token scores (:mod:`qkov.circuits.heads`; the framework paper's
  section "Two-Layer Attention-Only Transformers").

The held-out windows are text (a corpus' held-out split, as in training) or, where no text is
given, :func:`repeating_text`: random tokens that repeat, so that the in-context-learning score
still measures what induction heads do (see there).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor

from qkov.circuits.heads import induction_scores, previous_token_scores
from qkov.config import Config
from qkov.data.random_tokens import loss_per_repeat, repeated_random_tokens
from qkov.data.tokens import window_starts, windows_at
from qkov.hooks import patterns_only
from qkov.loss import token_losses
from qkov.model import AttnOnlyTransformer
from qkov.schedule import EVAL_TOKENS

REPEAT_SEQUENCES = 32  # repeated random sequences scored at each evaluation
EVAL_CHUNK = 32  # held-out windows whose logits are alive at once during an evaluation
EVAL_SEED_OFFSET = 7919  # the evaluation's random inputs come from ``seed + EVAL_SEED_OFFSET``
ICL_BLOCK = 8  # overlapping held-out windows per block (see the module docstring)
# Olsson et al.'s in-context-learning score: "the loss of the 500th token in the context minus the
# average loss of the 50th token", in a 1024-token context.
ICL_EARLY, ICL_LATE, ICL_CONTEXT = 50, 500, 1024


def icl_positions(n_ctx: int) -> tuple[int, int]:
    """The early and late positions (indices into ``loss_by_position``) of the in-context-learning
    score for a context of ``n_ctx``: Olsson et al.'s 50 and 500 exactly wherever the context
    holds them (``n_ctx >= 1024``), else scaled by ``n_ctx / 1024`` (``(6, 62)`` at 128), so that
    a short context still compares an early and a late position in the same proportions."""
    scale = min(1.0, n_ctx / ICL_CONTEXT)
    return round(ICL_EARLY * scale), round(ICL_LATE * scale)


@dataclass(frozen=True)
class EvaluationInputs:
    """What every evaluation of a run reads: the held-out ``windows``, in consecutive blocks of
    ``block`` that overlap (:func:`overlapping_windows`; 1: independent windows) and, for models
    with attention, random tokens repeated twice with period ``period`` (``repeated``, else None)."""

    windows: Int[Tensor, "batch seq"]
    repeated: Int[Tensor, "batch pos"] | None
    period: int
    block: int = 1

    def to(self, device: torch.device | str) -> EvaluationInputs:
        repeated = None if self.repeated is None else self.repeated.to(device)
        return EvaluationInputs(self.windows.to(device), repeated, self.period, self.block)


def repeating_text(cfg: Config, n_tokens: int, generator: torch.Generator) -> Int[Tensor, "batch seq"]:
    """Held-out windows of ``n_ctx + 1`` random tokens that repeat every ``late`` positions (the
    in-context-learning score's late position, :func:`icl_positions`), about ``n_tokens`` in all.

    The early position then lies in the first copy, where nothing in the context predicts the next
    token, and the late one starts the second copy, whose next token an induction head predicts:
    the score measures the in-context learning that induction heads bring, as it does on text."""
    length = cfg.n_ctx + 1
    period = max(2, icl_positions(cfg.n_ctx)[1])
    repeats = max(2, math.ceil(length / period))
    count = max(1, n_tokens // length)
    return repeated_random_tokens(count, period, repeats, cfg.d_vocab, generator)[:, :length]


def overlapping_windows(
    cfg: Config, held_out: Any, count: int, generator: torch.Generator, block: int = ICL_BLOCK
) -> tuple[Int[Tensor, "batch seq"], int]:
    """About ``count`` windows of ``n_ctx + 1`` tokens of ``held_out`` in blocks at random offsets,
    each block ``block`` windows starting ``late - early`` tokens apart (:func:`icl_positions`),
    and the block size used: smaller where the split or ``count`` is too short for two blocks of
    ``block``, 1 (independent windows) where the context has no ICL positions."""
    length = min(cfg.n_ctx + 1, len(held_out))
    early, late = icl_positions(cfg.n_ctx)
    stride = late - early
    if stride < 1 or late + 1 >= length:
        block = 1
    else:
        block = max(1, min(block, count // 2, 1 + (len(held_out) - length) // stride))
    span = length + (block - 1) * stride
    starts = window_starts(len(held_out), max(1, count // block), span, generator)
    return windows_at(held_out, [s + k * stride for s in starts for k in range(block)], length), block


def evaluation_inputs(
    cfg: Config, held_out: Any | None, n_tokens: int = EVAL_TOKENS, seed: int = 0, block: int = ICL_BLOCK
) -> EvaluationInputs:
    """The inputs of every evaluation of a model of ``cfg``, drawn on the CPU from ``seed``: about
    ``n_tokens`` held-out tokens in overlapping windows of ``held_out`` (a token array, or sharded
    tokens: ``len()`` and slices; :func:`overlapping_windows`, ``block`` to a block), or
    :func:`repeating_text` when ``held_out`` is None; then ``REPEAT_SEQUENCES`` random sequences
    of ``n_ctx // 2`` tokens, repeated twice."""
    generator = torch.Generator().manual_seed(seed + EVAL_SEED_OFFSET)
    if held_out is None:
        windows, block = repeating_text(cfg, n_tokens, generator), 1
    else:
        count = max(1, n_tokens // min(cfg.n_ctx + 1, len(held_out)))
        windows, block = overlapping_windows(cfg, held_out, count, generator, block)
    period = cfg.n_ctx // 2
    repeated = None
    if cfg.n_layers >= 1 and period >= 2:
        repeated = repeated_random_tokens(REPEAT_SEQUENCES, period, 2, cfg.d_vocab, generator)
    return EvaluationInputs(windows, repeated, period, block)


def held_out_metrics(
    model: AttnOnlyTransformer, windows: Tensor, block: int = 1
) -> dict[str, float | list[float]]:
    """``eval_loss``, ``loss_by_position``, ``icl_score`` and its standard error on the held-out
    windows, in blocks of ``block`` (the units of the standard error: each block's summed score)."""
    chunks = windows.split(EVAL_CHUNK)
    losses = torch.cat([token_losses(model(w[:, :-1]), w[:, 1:]) for w in chunks])  # [window, position]
    by_position = losses.mean(0)
    metrics: dict[str, float | list[float]] = {
        "eval_loss": float(by_position.mean()),
        "loss_by_position": [round(float(x), 4) for x in by_position],
    }
    early, late = icl_positions(model.cfg.n_ctx)
    if late < len(by_position) and early < late:
        metrics["icl_score"] = float(by_position[late] - by_position[early])
        per_block = (losses[:, late] - losses[:, early]).double().unflatten(0, (-1, block)).sum(1)
        if len(per_block) > 1:  # the blocks' spread: sqrt(B) sd(u_b) / windows
            metrics["icl_score_se"] = float(per_block.std() * len(per_block) ** 0.5 / len(losses))
    return metrics


@torch.no_grad()
def evaluate(model: AttnOnlyTransformer, inputs: EvaluationInputs) -> dict[str, float | list[float]]:
    """The measured fields of a training-log row (see the module docstring), by their
    :class:`~qkov.training_log.TrainingPoint` names, for the model as it is (its mode, its
    device, any autocast around the call)."""
    metrics = held_out_metrics(model, inputs.windows, inputs.block)
    if inputs.repeated is not None:
        tokens, period = inputs.repeated, inputs.period
        logits, cache = model.run_with_cache(tokens, names_filter=patterns_only)
        losses = token_losses(logits[:, :-1], tokens[:, 1:])
        metrics["repeat_loss_first"], metrics["repeat_loss_second"] = loss_per_repeat(losses, period)
        metrics["induction_score"] = float(induction_scores(cache, period).max())
        metrics["previous_token_score"] = float(previous_token_scores(cache).max())
    return metrics
