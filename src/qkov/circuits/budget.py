"""What the behavioural analyses cost per token, and the repeated-token batch that keeps each one
within a budget (so that ``qkov analyze`` on GPT-2 small's shapes, whose context is 1024 tokens,
stays bounded in time and memory while the default models keep their whole batch).

A repeated-token batch is ``sequences`` random sequences of ``period`` tokens, each repeated
``repeats`` times (section "Two-Layer Attention-Only Transformers": induction on repeated random
tokens). :func:`batch_shape` starts from the full batch and gives up sequences first, down to one,
then shortens the period: every score keeps its definition, only its sample shrinks.

Costs count ``2 x`` multiply-adds (FLOP) of the matrix products, the terms that dominate at these
shapes; elementwise work (softmax, LayerNorm, the cross-entropy's exponentials) is left out.
"""

from __future__ import annotations

from collections.abc import Callable

from qkov.config import Config

FLOAT_BYTES = 4  # the analyses run in the weights' float32


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
    full: tuple[int, int], repeats: int, cost: Callable[[int], float], budget: float
) -> tuple[int, int]:
    """``(sequences, period)`` of the largest repeated-token batch within ``budget``, where one token
    of a sequence of ``length`` costs ``cost(length)``: the full batch ``full = (sequences,
    period)`` when it fits; else as many of its sequences as fit; when not even one does, one
    sequence of the longest period that fits (at least 2, the shortest that repeats)."""
    sequences, period = full

    def fitting(p: int) -> int:
        length = repeats * p
        return int(budget // (length * cost(length)))

    while period > 2 and fitting(period) < 1:
        period -= 1
    return max(1, min(sequences, fitting(period))), period
