"""Repeated random tokens: the paper's test input for induction heads.

Uniformly random tokens have no statistics to exploit, so a model can only predict the second (or
third) repeat of a random sequence by finding the earlier occurrence in its context: induction.
"""

from __future__ import annotations

import torch
from jaxtyping import Int
from torch import Tensor

from qkov.errors import QkovError


def repeated_random_tokens(
    batch_size: int, length: int, repeats: int, d_vocab: int, generator: torch.Generator
) -> Int[Tensor, "batch pos"]:
    """``batch_size`` sequences, each one random sequence of ``length`` tokens repeated
    ``repeats`` times (``pos = length * repeats``). Token 0 (end-of-text) is never drawn."""
    if length < 2 or repeats < 2:
        raise QkovError(f"repeated random tokens need length >= 2 and repeats >= 2, got {length}, {repeats}")
    if d_vocab < 2:
        raise QkovError("repeated random tokens need a vocabulary of at least 2 tokens")
    block = torch.randint(1, d_vocab, (batch_size, length), generator=generator)
    return block.repeat(1, repeats)
