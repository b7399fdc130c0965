"""What each head does, from attention patterns (section "Two-Layer Attention-Only Transformers":
previous-token, duplicate-token and induction heads); copying is in :mod:`qkov.circuits.copying`.

- A *previous-token* head attends from each position to the one before it.
- An *induction* head, on a sequence that repeats with period ``L``, attends from a token in a
  repeat to the token just after the same token's previous occurrence: ``src = dest - L + 1``.

Scores are mean attention weights in ``[0, 1]``, one per head, ``[n_layers, n_heads]``. On
sequences that begin with a start token (BOS) they are read on the positions after it
(:func:`after_start`), with the same definitions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from qkov.hooks import patterns_only
from qkov.model import ActivationCache, AttnOnlyTransformer
from qkov.names import head_name, hook_name

# A head plays a role when its score passes these; the claims, the command's summary and the report
# all use them. The paper gives no numbers. The default 2-layer runs so far measured their
# previous-token head at 0.53-0.86 and their induction head at 0.31-0.42 (a perfect one scores 1.0,
# uniform attention over 128 positions about 0.01).
PREVIOUS_TOKEN_HEAD = 0.5
INDUCTION_HEAD = 0.3


def _stacked_patterns(cache: ActivationCache) -> Float[Tensor, "n_layers batch n_heads dest src"]:
    n_layers = sum(1 for key in cache if key.endswith("attn.hook_pattern"))
    return torch.stack([cache[hook_name(layer, "pattern")] for layer in range(n_layers)])


def after_start(cache: ActivationCache, start: int) -> ActivationCache:
    """Every attention pattern of ``cache`` among the positions from ``start`` on (``start = 1``: the
    positions after a start token): rows and columns before ``start`` dropped, so that every offset
    and every position keeps its meaning within the sequence after the start token (attention paid
    to the start token itself counts for no score)."""
    if not start:
        return cache
    n_layers = sum(1 for key in cache if key.endswith("attn.hook_pattern"))
    names = [hook_name(layer, "pattern") for layer in range(n_layers)]
    return {name: cache[name][..., start:, start:] for name in names}


def offset_attention(
    cache: ActivationCache, offset: int, first_dest: int
) -> Float[Tensor, "n_layers n_heads"]:
    """Mean attention from ``dest`` to ``src = dest - offset`` over ``dest >= first_dest``."""
    return pattern_offset_attention(_stacked_patterns(cache), offset, first_dest)


def pattern_offset_attention(
    patterns: Float[Tensor, "... batch n_heads dest src"], offset: int, first_dest: int
) -> Float[Tensor, "... n_heads"]:
    """:func:`offset_attention` of patterns given directly: the mean over the batch and over
    ``dest >= first_dest`` of the attention from ``dest`` to ``dest - offset``."""
    diagonal = patterns.diagonal(offset=-offset, dim1=-2, dim2=-1)  # [..., dest - offset]
    skip = first_dest - offset  # the diagonal starts at dest = offset
    return diagonal[..., skip:].mean(dim=(-3, -1))


def previous_token_scores(cache: ActivationCache) -> Float[Tensor, "n_layers n_heads"]:
    """Mean attention from each position (but the first) to the previous one."""
    return offset_attention(cache, offset=1, first_dest=1)


def induction_scores(cache: ActivationCache, period: int) -> Float[Tensor, "n_layers n_heads"]:
    """Mean attention to the token after the previous occurrence, on tokens repeating every
    ``period`` positions, over every position after the first repeat."""
    return offset_attention(cache, offset=period - 1, first_dest=period)


def duplicate_token_scores(cache: ActivationCache, period: int) -> Float[Tensor, "n_layers n_heads"]:
    """Mean attention to the previous occurrence of the same token (``src = dest - period``) on
    tokens repeating every ``period`` positions: a duplicate-token head."""
    return offset_attention(cache, offset=period, first_dest=period)


@dataclass(frozen=True)
class AttentionExample:
    """Every head's attention pattern on one sequence: ``patterns[head][dest][src]`` for
    ``src <= dest`` (rounded to 3 decimals); ``description`` says what the sequence is."""

    description: str
    tokens: list[int]
    patterns: dict[str, list[list[float]]]


@dataclass(frozen=True)
class AttentionExamples:
    """The patterns the report draws: on repeated random tokens, on a corpus snippet if any, and
    on the first of the user's sequences if any."""

    repeated: AttentionExample
    corpus: AttentionExample | None
    user: AttentionExample | None = None


@torch.no_grad()
def attention_example(
    model: AttnOnlyTransformer, tokens: Int[Tensor, "pos"], description: str
) -> AttentionExample:
    """Every head's attention pattern on one sequence of ``tokens``."""
    _, cache = model.run_with_cache(tokens[None], names_filter=patterns_only, return_type=None)
    patterns = {}
    for layer in range(model.cfg.n_layers):
        for head, pattern in enumerate(cache[hook_name(layer, "pattern")][0]):
            patterns[head_name(layer, head)] = [
                [round(float(x), 3) for x in row[: dest + 1]] for dest, row in enumerate(pattern)
            ]
    return AttentionExample(description, tokens.tolist(), patterns)
