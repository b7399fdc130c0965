"""What the behavioural analyses cost per token, and the repeated-token batch that keeps each one
within a budget (so that ``qkov analyze`` on GPT-2 small's shapes, whose context is 1024 tokens,
stays bounded in time and memory while the default models keep their whole batch).

A repeated-token batch is ``sequences`` random sequences of ``period`` tokens, each repeated
``repeats`` times (section "Two-Layer Attention-Only Transformers": induction on repeated random
tokens). :func:`batch_shape` starts from the full batch and gives up sequences first, down to a
floor, then shortens the period down to a floor: every score keeps its definition, only its sample
shrinks. The steps a researcher reads as behaviour (head scores, ablations, term importance) keep
at least ``TRUSTED``, 8 sequences of 128 tokens, even where that exceeds their budget: one short
sequence is a sample too small to lean on.

Costs count ``2 x`` multiply-adds (FLOP) of the matrix products, the terms that dominate at these
shapes; elementwise work (softmax, LayerNorm, the cross-entropy's exponentials) is left out.
"""

from __future__ import annotations

from collections.abc import Callable

from qkov.config import Config

FLOAT_BYTES = 4  # the analyses run in the weights' float32
TRUSTED = (8, 128)  # (sequences, tokens per sequence) the behavioural steps never cut below


def layer_flop(cfg: Config, length: int) -> float:
    """One layer, one token, in a sequence of ``length``: the Q, K, V and O projections, the
    scores and the pattern's product with the values (``length`` sources at most), and the MLP."""
    heads = cfg.n_heads * cfg.d_head
    return 2 * (4 * cfg.d_model * heads + 2 * length * heads + 2 * cfg.d_model * cfg.d_mlp)


def unembed_flop(cfg: Config) -> float:
    """One token's logits: ``x @ W_U``."""
    return 2 * cfg.d_model * cfg.d_out


def forward_flop(cfg: Config, length: int) -> float:
    """One token through the whole model, logits included."""
    return cfg.n_layers * layer_flop(cfg, length) + unembed_flop(cfg)


def cache_bytes(cfg: Config, length: int) -> float:
    """What ``run_with_cache`` keeps per token at ``length``: every head's pattern row and write,
    the residual streams, MLP writes and LayerNorm scales (about 6 ``d_model`` vectors a layer), and
    the logits with the cross-entropy's copy of them."""
    per_layer = cfg.n_heads * (length + cfg.d_model) + 6 * cfg.d_model
    return FLOAT_BYTES * (cfg.n_layers * per_layer + 2 * cfg.d_out)


def batch_shape(
    full: tuple[int, int],
    repeats: int,
    cost: Callable[[int], float],
    budget: float,
    least: tuple[int, int] = (1, 0),
) -> tuple[int, int]:
    """``(sequences, period)`` of the largest repeated-token batch within ``budget``, where one token
    of a sequence of ``length`` costs ``cost(length)``: the full batch ``full = (sequences,
    period)`` when it fits; else as many of its sequences as fit, down to ``least = (sequences,
    tokens)``'s; then the longest period that fits that many, down to ``least``'s ``tokens`` per
    sequence (``repeats x period``; a period of 2 at least, the shortest that repeats). The floor
    is kept even where it exceeds ``budget``, and is never more than ``full``."""
    sequences, period = full
    fewest = min(sequences, least[0])
    shortest = min(period, max(2, -(-least[1] // repeats)))

    def fitting(p: int) -> int:
        length = repeats * p
        return int(budget // (length * cost(length)))

    if period > shortest and fitting(period) < fewest:  # the longest period that fits, by bisection:
        low, high = shortest, period  # fewer tokens never cost more (n_ctx 10^9 took forever one by one)
        while low < high:
            middle = (low + high + 1) // 2
            low, high = (middle, high) if fitting(middle) >= fewest else (low, middle - 1)
        period = low
    return max(fewest, min(sequences, fitting(period))), period
