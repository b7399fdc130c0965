"""Repeated random tokens: the paper's test input for induction heads.

Uniformly random tokens have no statistics to exploit, so a model can only predict the second (or
third) repeat of a random sequence by finding the earlier occurrence in its context: induction.
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
from torch import Tensor

from qkov.errors import QkovError


def repeated_random_tokens(
    batch_size: int,
    length: int,
    repeats: int,
    d_vocab: int,
    generator: torch.Generator,
    bos_token_id: int | None = None,
) -> Int[Tensor, "batch pos"]:
    """``batch_size`` sequences, each one random sequence of ``length`` tokens repeated
    ``repeats`` times (``pos = length * repeats``). Token 0 (end-of-text) is never drawn.

    With ``bos_token_id``, every sequence begins with that start token, then the repeats
    (``pos = 1 + length * repeats``), as the paper's induction test begins with ``<START>``; the
    start token is then never drawn either (the same draws shifted past it), so it occurs only at
    position 0, as in training."""
    if length < 2 or repeats < 2:
        raise QkovError(f"repeated random tokens need length >= 2 and repeats >= 2, got {length}, {repeats}")
    skip = bos_token_id is not None and bos_token_id > 0
    if d_vocab < 2 + skip:
        raise QkovError(f"repeated random tokens need a vocabulary of at least {2 + skip} tokens")
    high = d_vocab - skip
    block = torch.randint(1, high, (batch_size, length), generator=generator, device=generator.device)
    if skip:
        block = block + (block >= bos_token_id)
    sequences = block.repeat(1, repeats)
    if bos_token_id is None:
        return sequences
    return torch.cat([torch.full_like(sequences[:, :1], bos_token_id), sequences], dim=1)


def loss_per_repeat(losses: Float[Tensor, "... pos"], period: int) -> list[float]:
    """The mean next-token loss on each repeat of a sequence that repeats every ``period`` tokens,
    from the per-position losses (``losses[..., i]``: the loss of predicting token ``i + 1``).

    The one definition used by the trainer's metrics and by ``analyze``: repeat ``r`` is the
    prediction of tokens ``r * period + 1 ... (r + 1) * period - 1``, every token of copy ``r`` but
    its first. The first token of a copy follows the last of the previous one, a pair never seen
    before, so no model can predict it; it belongs to no repeat. Positions past the last whole
    repeat are ignored; ``...`` (e.g. a batch) is averaged over.
    """
    by_position = losses.reshape(-1, losses.shape[-1]).mean(0)
    return [float(by_position[s].mean()) for s in repeat_slices(len(by_position), period)]


def repeat_slices(n_losses: int, period: int) -> list[slice]:
    """The positions of each whole repeat among ``n_losses`` next-token losses
    (:func:`loss_per_repeat`)."""
    if period < 2:
        raise QkovError(f"the loss per repeat needs a period of at least 2, got {period}")
    return [slice(r * period, (r + 1) * period - 1) for r in range((n_losses + 1) // period)]
