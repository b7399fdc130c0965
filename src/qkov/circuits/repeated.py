"""Behaviour on repeated random tokens (section "Two-Layer Attention-Only Transformers": a sequence
of random tokens repeated is predictable only by looking back, so a model that has induction heads
predicts every repeat after the first, and one that has none cannot).

Each sequence is ``period`` random tokens repeated ``repeats`` times; the next-token loss is
averaged within each repeat (:func:`qkov.data.random_tokens.loss_per_repeat`), and every head's
previous-token, induction and duplicate-token scores (:mod:`qkov.circuits.heads`) are read from
the same run's patterns.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from qkov.circuits.heads import (
    INDUCTION_HEAD,
    PREVIOUS_TOKEN_HEAD,
    after_start,
    duplicate_token_scores,
    induction_scores,
    previous_token_scores,
)
from qkov.data.random_tokens import loss_per_repeat
from qkov.hooks import patterns_only
from qkov.loss import logit_buffer
from qkov.model import AttnOnlyTransformer
from qkov.names import head_name, hook_name
from qkov.numbers import finite


@dataclass(frozen=True)
class HeadBehaviour:
    """One head's attention on repeated random tokens: mean attention one back (previous-token),
    to the token after the previous occurrence (induction) and to the previous occurrence itself
    (duplicate-token); the ``_se`` fields are the first two scores' standard errors over the
    sequences (None with a single sequence)."""

    name: str
    layer: int
    head: int
    previous_token_score: float | None
    induction_score: float | None
    duplicate_token_score: float | None
    previous_token_score_se: float | None = None
    induction_score_se: float | None = None


@dataclass(frozen=True)
class RepeatedTokens:
    """Behaviour on ``sequences`` random sequences of ``period`` tokens repeated ``repeats`` times:
    the mean next-token loss on each repeat and every head's scores. ``previous_token_heads`` and
    ``induction_heads`` are the heads whose score passes ``previous_token_threshold`` and
    ``induction_threshold``. ``bos_token_id``: the start token every sequence began with (the
    scores and losses are then read on the positions after it), or None. ``repeat_drop_se``: the
    standard error, over the sequences, of the loss's drop from the first repeat to the second."""

    period: int
    repeats: int
    sequences: int
    loss_per_repeat: list[float]
    heads: list[HeadBehaviour]
    previous_token_threshold: float
    induction_threshold: float
    previous_token_heads: list[str]
    induction_heads: list[str]
    bos_token_id: int | None = None
    repeat_drop_se: float | None = None


@torch.no_grad()
def repeated_token_behaviour(
    model: AttnOnlyTransformer,
    tokens: Int[Tensor, "batch pos"],
    period: int,
    repeats: int,
    bos_token_id: int | None = None,
) -> RepeatedTokens:
    """The loss per repeat and every head's scores on ``tokens``, sequences repeating every
    ``period`` positions (``repeats`` times), after the start token ``bos_token_id`` when given
    (``tokens[:, 0]``), whose position then counts for no score and no loss."""
    # the scores read the patterns alone (every head's write, at Llama-3.2-1B's shapes 4 MiB a token,
    # is not kept), the losses the final stream, unembedded a block at a time (no logits tensor)
    final = hook_name(model.cfg.n_layers - 1, "resid_post")
    _, cache = model.run_with_cache(
        tokens, names_filter=lambda name: patterns_only(name) or name == final, return_type=None
    )
    start = int(bos_token_id is not None)
    stream, targets = cache.pop(final)[:, start:-1], tokens[:, start + 1 :]
    losses = model.stream_losses(stream, targets, logit_buffer(targets.numel(), model.W_U))
    repeats_only = after_start(cache, start)
    induction = induction_scores(repeats_only, period)
    previous, duplicate = previous_token_scores(repeats_only), duplicate_token_scores(repeats_only, period)
    previous_se, induction_se = (_standard_error(repeats_only, score) for score in (
        previous_token_scores, lambda c: induction_scores(c, period)))  # fmt: skip
    heads = [
        HeadBehaviour(
            name=head_name(layer, head),
            layer=layer,
            head=head,
            previous_token_score=finite(previous[layer, head]),
            induction_score=finite(induction[layer, head]),
            duplicate_token_score=finite(duplicate[layer, head]),
            previous_token_score_se=None if previous_se is None else finite(previous_se[layer, head]),
            induction_score_se=None if induction_se is None else finite(induction_se[layer, head]),
        )
        for layer, head in np.ndindex(previous.shape)
    ]
    return RepeatedTokens(
        period=period,
        repeats=repeats,
        sequences=tokens.shape[0],
        loss_per_repeat=loss_per_repeat(losses, period),
        heads=heads,
        previous_token_threshold=PREVIOUS_TOKEN_HEAD,
        induction_threshold=INDUCTION_HEAD,
        previous_token_heads=[h.name for h in heads if (h.previous_token_score or 0) > PREVIOUS_TOKEN_HEAD],
        induction_heads=[h.name for h in heads if (h.induction_score or 0) > INDUCTION_HEAD],
        bos_token_id=bos_token_id,
        repeat_drop_se=_drop_error(losses, period),
    )


def _standard_error(cache: dict, score: Callable[[dict], Tensor]) -> Tensor | None:
    """The standard error over the sequences of a per-head score: the score of each sequence alone,
    their standard deviation over the square root of their number (None for one sequence)."""
    batch = next(iter(cache.values())).shape[0]
    if batch < 2:
        return None
    each = torch.stack([score({k: v[b : b + 1] for k, v in cache.items()}) for b in range(batch)])
    return each.double().std(0) / batch**0.5


def _drop_error(losses: Float[Tensor, "batch pos"], period: int) -> float | None:
    """The standard error over the sequences of the loss's drop from the first repeat to the second,
    from each position's next-token loss (on the repeats)."""
    if losses.shape[0] < 2:
        return None
    per_sequence = [loss_per_repeat(row, period) for row in losses]
    if len(per_sequence[0]) < 2:
        return None
    drops = [r[0] - r[1] for r in per_sequence]
    return finite(float(np.std(drops, ddof=1)) / len(drops) ** 0.5)
