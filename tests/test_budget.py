"""The batch rule of the behavioural analyses (``qkov.circuits.budget``): the full repeated-token
batch when it fits the budget, else fewer sequences, else a shorter period; the default model fits
every budget whole and GPT-2 small's shapes are cut to a bounded batch (the batches the steps then
read are tests/test_context.py)."""

from __future__ import annotations

from functools import partial

import pytest
import torch

import qkov
from qkov import context
from qkov.circuits import budget
from qkov.circuits.ablation import ablation_flop
from qkov.circuits.paths import term_importance_flop

from conftest import random_model

GPT2 = qkov.Config(
    n_layers=12,
    n_heads=12,
    d_model=768,
    d_head=64,
    d_vocab=50257,
    n_ctx=1024,
    d_mlp=3072,
    normalization="LNPre",
)
DEFAULT_2_LAYER = qkov.Config(n_layers=2, n_heads=4, d_model=128, d_head=32, d_vocab=4096, n_ctx=128)


def test_the_rule_gives_up_sequences_first_then_period():
    def per_token(length):
        return 10.0

    assert budget.batch_shape((32, 40), 3, per_token, 32 * 120 * 10) == (32, 40)  # fits exactly
    assert budget.batch_shape((32, 40), 3, per_token, 5 * 120 * 10 + 9) == (5, 40)
    assert budget.batch_shape((32, 40), 3, per_token, 30 * 10) == (1, 10)  # one sequence of 30 tokens
    assert budget.batch_shape((32, 40), 3, per_token, 1.0) == (1, 2)  # never below the shortest repeat


@pytest.mark.parametrize(
    "cost, limit",
    [
        (partial(budget.cache_bytes, GPT2), context.REPEATED_CACHE_BYTES),
        (partial(ablation_flop, GPT2), context.RERUN_FLOP_BUDGET),
        (partial(term_importance_flop, GPT2), context.RERUN_FLOP_BUDGET),
    ],
)
def test_gpt2_small_is_cut_within_each_budget_and_the_default_model_is_not(cost, limit):
    sequences, period = budget.batch_shape((context.REPEAT_BATCH, 341), context.REPEATS, cost, limit)
    length = context.REPEATS * period
    assert sequences * length * cost(length) <= limit
    assert sequences < context.REPEAT_BATCH  # at n_ctx 1024 none of the three fits whole
    default = partial(cost.func, DEFAULT_2_LAYER)
    assert budget.batch_shape((32, 42), 3, default, limit) == (32, 42)


def test_the_cache_estimate_covers_what_run_with_cache_keeps():
    cfg = qkov.Config(
        n_layers=2, n_heads=3, d_model=16, d_head=4, d_vocab=40, n_ctx=24, d_mlp=8, normalization="LN"
    )
    model, tokens = random_model(cfg), torch.randint(0, 40, (2, 24))
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens)
    kept = sum(t.numel() * t.element_size() for t in [logits, *cache.values()])
    assert kept <= tokens.numel() * budget.cache_bytes(cfg, 24)


def test_a_huge_context_is_cut_at_once():
    """A model without positions and n_ctx 10^9: the period is found by bisection (the loop that
    shortened it one token at a time spun for hours)."""
    full = (16, 10**9 // 3)
    shape = budget.batch_shape(full, 3, lambda length: 100.0 * length, 1e9, (8, 128))
    assert shape[0] == 8 and 43 <= shape[1] < 1000
    assert budget.batch_shape(full, 3, lambda length: 100.0 * length, 1e9 * 8 * 3 * 100, (8, 128))[1] > 43
