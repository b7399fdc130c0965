"""Ablating a head: replace its write to the residual stream by zero or by its mean, and see what
breaks downstream (section "Two-Layer Attention-Only Transformers": without the previous-token head
there is no induction).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Int
from torch import Tensor

from qkov.circuits.heads import induction_scores
from qkov.data.random_tokens import loss_per_repeat
from qkov.errors import QkovError
from qkov.loss import token_losses
from qkov.model import AttnOnlyTransformer
from qkov.names import head_name, hook_name

MODES = ("zero", "mean")


@dataclass(frozen=True)
class RepeatBehaviour:
    """On tokens repeating every ``period`` positions: every head's induction score
    ``[n_layers][n_heads]`` and the mean next-token loss on each repeat."""

    induction: list[list[float]]
    loss_per_repeat: list[float]


def repeat_behaviour(
    logits: Tensor, cache: dict, tokens: Int[Tensor, "batch pos"], period: int
) -> RepeatBehaviour:
    per_repeat = loss_per_repeat(token_losses(logits[:, :-1], tokens[:, 1:]), period)
    return RepeatBehaviour(induction_scores(cache, period).tolist(), per_repeat)


@torch.no_grad()
def run_ablated(
    model: AttnOnlyTransformer,
    tokens: Int[Tensor, "batch pos"],
    layer: int,
    head: int,
    mode: str,
    clean_cache: dict | None = None,
) -> tuple[Tensor, dict]:
    """Logits and cache with head ``(layer, head)``'s write replaced: by zero (``"zero"``) or by
    its mean over the batch and positions of this input (``"mean"``, taken from ``clean_cache``,
    the unablated run on ``tokens``, which is computed when not given)."""
    if mode not in MODES:
        raise QkovError(f"ablation mode must be 'zero' or 'mean', got {mode!r}")
    mean = None
    if mode == "mean":
        clean = clean_cache if clean_cache is not None else model.run_with_cache(tokens)[1]
        mean = clean[hook_name(layer, "result")][:, :, head].mean((0, 1))

    def edit(at_layer: int, writes: Tensor) -> Tensor:
        if at_layer != layer:
            return writes
        writes = writes.clone()
        writes[:, :, head] = 0.0 if mean is None else mean
        return writes

    return model.run_with_cache(tokens, edit_writes=edit)


@dataclass(frozen=True)
class AblationEffect:
    """One earlier head replaced by zero or by its mean (``mode``): the change in each later head's
    induction score and in the loss on each repeat, against the clean run."""

    head: str
    mode: str
    induction_change: dict[str, float]
    loss_per_repeat: list[float]
    loss_change: list[float]


@torch.no_grad()
def ablation_effects(
    model: AttnOnlyTransformer,
    tokens: Int[Tensor, "batch pos"],
    period: int,
    clean_run: tuple[Tensor, dict] | None = None,
) -> list[AblationEffect]:
    """For every head of every layer but the last, zero- and mean-ablated: the change in each later
    head's induction score and in the loss on each repeat, against the clean run (``clean_run``,
    the unablated ``(logits, cache)`` on ``tokens``, computed when not given)."""
    tokens = model.check_tokens(tokens)
    logits, cache = clean_run if clean_run is not None else model.run_with_cache(tokens)
    clean = repeat_behaviour(logits, cache, tokens, period)
    effects = []
    for layer in range(model.cfg.n_layers - 1):
        for head in range(model.cfg.n_heads):
            for mode in MODES:
                run = run_ablated(model, tokens, layer, head, mode, clean_cache=cache)
                ablated = repeat_behaviour(*run, tokens, period)
                changes = zip(ablated.loss_per_repeat, clean.loss_per_repeat, strict=True)
                effects.append(
                    AblationEffect(
                        head=head_name(layer, head),
                        mode=mode,
                        induction_change={
                            head_name(later, h): ablated.induction[later][h] - clean.induction[later][h]
                            for later in range(layer + 1, model.cfg.n_layers)
                            for h in range(model.cfg.n_heads)
                        },
                        loss_per_repeat=ablated.loss_per_repeat,
                        loss_change=[a - c for a, c in changes],
                    )
                )
    return effects
