"""A model on its own task: the loss and accuracy against the user's targets, and what each head
contributes to them, by ablation (section "Two-Layer Attention-Only Transformers" ablates heads to
see what breaks; here the measure is the task's own, not the next token's).

The targets are per position, ``-100`` where a position has none (:mod:`qkov.data.user_tokens`): a
classifier's label at its last position, or an algorithmic task's answer at every position. A
head is ablated by replacing its write to the residual stream by zero or by its mean over this
data's batch at each position (:func:`qkov.circuits.ablation.run_ablated`), every head of every
layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from qkov.circuits.ablation import MODES, run_ablated
from qkov.circuits.budget import forward_flop
from qkov.config import Config
from qkov.data.user_tokens import IGNORE
from qkov.model import AttnOnlyTransformer
from qkov.names import head_name


@dataclass(frozen=True)
class HeadAblation:
    """The task's loss and accuracy with one head zero- or mean-ablated (``mode``), and their
    change against the clean run (a loss that rises, an accuracy that falls: the head is needed)."""

    head: str
    mode: str
    loss: float
    accuracy: float
    loss_change: float
    accuracy_change: float


@dataclass(frozen=True)
class Task:
    """The model on ``data`` (the user's tokens and targets): the mean cross-entropy (nats), the
    accuracy (the argmax is the target) and the mean probability of the target over the
    ``positions`` that have a target in ``sequences`` sequences; ``ablations``: each head's."""

    data: str
    sequences: int
    positions: int
    loss: float
    accuracy: float
    mean_target_probability: float
    ablations: list[HeadAblation]


def scored(logits: Float[Tensor, "batch pos d_out"], targets: Int[Tensor, "batch pos"]) -> tuple[float, ...]:
    """``(loss, accuracy, mean probability of the target)`` over the positions with a target."""
    has = targets != IGNORE
    chosen, wanted = logits[has].double(), targets[has]
    log_probs = chosen.log_softmax(-1).gather(1, wanted[:, None])[:, 0]
    loss = float(F.cross_entropy(chosen, wanted))
    return loss, float((chosen.argmax(-1) == wanted).double().mean()), float(log_probs.exp().mean())


def task_flop(cfg: Config, length: int) -> float:
    """FLOP per token of :func:`task_performance`: the clean run and, per mode, one full run per head."""
    return (1 + len(MODES) * cfg.n_layers * cfg.n_heads) * forward_flop(cfg, length)


@torch.no_grad()
def task_performance(
    model: AttnOnlyTransformer,
    tokens: Int[Tensor, "batch pos"],
    targets: Int[Tensor, "batch pos"],
    data: str,
) -> Task:
    """The loss, accuracy and mean target probability of ``model`` on ``tokens`` against ``targets``
    (``-100``: no target), and the same with each head zero- and mean-ablated. ``data`` names the
    data in the result."""
    tokens, targets = model.check_tokens(tokens), targets.to(model.device)
    # the ablations read the clean run's z alone
    logits, cache = model.run_with_cache(tokens, names_filter=lambda name: name.endswith("hook_z"))
    loss, accuracy, probability = scored(logits, targets)
    ablations = []
    for layer in range(model.cfg.n_layers):
        for head in range(model.cfg.n_heads):
            for mode in MODES:
                ablated, _ = run_ablated(model, tokens, layer, head, mode, cache, names_filter=[])
                a_loss, a_accuracy, _ = scored(ablated, targets)
                ablations.append(
                    HeadAblation(
                        head_name(layer, head), mode, a_loss, a_accuracy, a_loss - loss, a_accuracy - accuracy
                    )
                )
    positions = int((targets != IGNORE).sum())
    return Task(data, tokens.shape[0], positions, loss, accuracy, probability, ablations)
