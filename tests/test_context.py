"""What every analysis step reads (``qkov.context``): the random batches drawn once from the seed, in
a fixed order, on the CPU (the same tokens whatever the device), cut to the cache budget, and the
parts of them a step that reruns the model takes within the FLOP budget, each described as cut."""

from __future__ import annotations

import dataclasses
from functools import partial
from types import MappingProxyType

import numpy as np
import pytest
import torch

import qkov
from qkov import analyze, context
from qkov.circuits import budget
from qkov.circuits.ablation import ablation_flop
from qkov.circuits.attribution_patching import estimate_and_rerun_flop
from qkov.circuits.paths import term_importance_flop
from qkov.data.random_tokens import repeated_random_tokens
from qkov.data.tokens import TokenSplits, sample_windows
from qkov.data.user_tokens import UserTokens
from test_budget import DEFAULT_2_LAYER

from conftest import random_model

# period 10 (30 repeated tokens), or 10 after a start token; a pattern example of 31 tokens (period 10)
CFG = qkov.Config(n_layers=1, n_heads=2, d_model=8, d_head=4, d_vocab=30, n_ctx=31)
BOS = 29
RNG = np.random.default_rng(0)
CORPUS = TokenSplits(RNG.integers(0, 29, 3000), RNG.integers(0, 29, 600))


def per_token(length: int) -> float:
    return 1.0  # a FLOP per token: a batch costs its number of tokens


def context_of(model, corpus=None, seed=0, user=None) -> context.Context:
    return context.Context.of(model, corpus, seed, MappingProxyType({}), user)


def test_a_default_sized_model_keeps_its_batch_for_every_step():
    ctx = context_of(qkov.AttnOnlyTransformer(DEFAULT_2_LAYER))
    assert tuple(ctx.repeated.shape) == (32, 126) and ctx.period == 42
    for cost in (ablation_flop, term_importance_flop):
        tokens, period, described = ctx.rerun_batch(partial(cost, DEFAULT_2_LAYER))
        assert torch.equal(tokens, ctx.repeated) and period == 42 and described == "repeated random tokens"


def test_over_budget_steps_run_on_a_cut_batch_and_say_so(monkeypatch):
    model = random_model(qkov.Config(n_layers=2, n_heads=2, d_model=16, d_head=8, d_vocab=24, n_ctx=30))
    monkeypatch.setattr(context, "RERUN_FLOP_BUDGET", 2e6)
    done = analyze.run_steps(model, ["term_importance", "ablation"])
    effects = done["ablation"]
    cost = partial(estimate_and_rerun_flop, model.cfg)
    shape = budget.batch_shape((32, 10), 3, cost, 2e6, budget.TRUSTED)
    assert {(e.sequences, e.period) for e in effects} == {shape} == {(8, 10)}  # cut to the floor
    described = done["term_importance"].tokens
    assert described.startswith("repeated random tokens") and " x " in described


@pytest.mark.parametrize("bos", [None, BOS], ids=["no start token", "start token"])
def test_the_batches_are_drawn_from_the_seed_in_a_fixed_order(bos):
    """The known order: the repeats, the example, then the snippet and the text windows, all from
    one generator seeded with ``seed``; with a start token every sequence begins with it."""
    cfg = dataclasses.replace(CFG, bos_token_id=bos)
    ctx = context_of(random_model(cfg), CORPUS, seed=7)
    gen = torch.Generator().manual_seed(7)
    repeated = repeated_random_tokens(32, 10, 3, 30, gen, bos_token_id=bos)
    example = repeated_random_tokens(1, 10, 3, 30, gen, bos_token_id=bos)[0]
    start = int(bos is not None)
    snippet = sample_windows(CORPUS.eval, 1, 31 - start, gen)[0]
    text = sample_windows(CORPUS.eval, 32, 31 - start, gen)
    if bos is not None:
        snippet = torch.cat([torch.tensor([bos]), snippet])
        text = torch.cat([torch.full((32, 1), bos), text], dim=1)
    assert (ctx.period, ctx.example_period, ctx.start) == (10, 10, start)
    assert torch.equal(ctx.repeated, repeated) and ctx.repeated.shape == (32, start + 30)
    assert torch.equal(ctx.example, example) and torch.equal(ctx.snippet, snippet)
    assert torch.equal(ctx.text, text) and ctx.text.shape == (32, 31)
    assert not torch.equal(context_of(random_model(cfg), CORPUS, seed=8).repeated, repeated)


def test_without_layers_nothing_is_drawn():
    ctx = context_of(qkov.AttnOnlyTransformer(dataclasses.replace(CFG, n_layers=0)), CORPUS)
    assert ctx.period == 10 and ctx.repeated is ctx.example is ctx.snippet is ctx.text is None


def test_the_repeats_are_cut_to_the_cache_budget_and_nothing_else_moves(monkeypatch):
    model = random_model(CFG)
    whole = context_of(model, CORPUS)
    for fitting, kept in ((12, 12), (5, 8)):  # never below 8 sequences (budget.TRUSTED)
        monkeypatch.setattr(context, "REPEATED_CACHE_BYTES", fitting * 30 * budget.cache_bytes(CFG, 30))
        cut = context_of(model, CORPUS)
        assert torch.equal(cut.repeated, whole.repeated[:kept])  # the first of the same 32 draws
        assert torch.equal(cut.example, whole.example) and torch.equal(cut.text, whole.text)


def same_batches(a: context.Context, b: context.Context) -> bool:
    pairs = [(a.repeated, b.repeated), (a.example, b.example), (a.snippet, b.snippet), (a.text, b.text)]
    return all(torch.equal(x.cpu(), y.cpu()) for x, y in pairs)


@pytest.mark.parametrize("bos", [None, BOS], ids=["no start token", "start token"])
def test_the_batches_are_the_same_whatever_the_default_device(bos):
    """A tensor made without a device lands on the default one: under ``meta`` (tensors without
    data) such a tensor would fail or change a number. The draws are on the CPU's generator."""
    model = random_model(dataclasses.replace(CFG, bos_token_id=bos))
    expected = context_of(model, CORPUS, seed=3)
    with torch.device("meta"):
        got = context_of(model, CORPUS, seed=3)
    assert got.repeated.device.type == "cpu" and same_batches(got, expected)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_batches_on_a_gpu_are_the_cpus(monkeypatch):
    model = random_model(dataclasses.replace(CFG, bos_token_id=BOS))
    expected = context_of(model, CORPUS, seed=3)
    got = context_of(model.cuda(), CORPUS, seed=3)
    assert {t.device.type for t in (got.repeated, got.example, got.snippet, got.text)} == {"cuda"}
    assert same_batches(got, expected)
    monkeypatch.setattr(context, "RERUN_FLOP_BUDGET", 20.0)  # a shorter period, drawn again
    (tokens, period, _), (cpu_tokens, _, _) = got.rerun_batch(per_token), expected.rerun_batch(per_token)
    assert period == 6 and tokens.device.type == "cuda" and torch.equal(tokens.cpu(), cpu_tokens)


@pytest.mark.parametrize(
    ("limit", "bos", "shape", "described"),
    [
        (960.0, None, (32, 30), "repeated random tokens"),
        (300.0, None, (10, 30), "repeated random tokens (10 x 30 tokens)"),
        (20.0, None, (1, 18), "repeated random tokens of period 6 (1 x 18 tokens)"),
        (992.0, BOS, (32, 31), "repeated random tokens after the start token"),
        (20.0, BOS, (1, 19), "repeated random tokens of period 6 after the start token (1 x 19 tokens)"),
    ],
)
def test_rerun_batch_takes_sequences_then_a_shorter_period(monkeypatch, limit, bos, shape, described):
    monkeypatch.setattr(context, "RERUN_FLOP_BUDGET", limit)
    ctx = context_of(random_model(dataclasses.replace(CFG, bos_token_id=bos)), seed=4)
    tokens, period, description = ctx.rerun_batch(per_token)
    assert tuple(tokens.shape) == shape and description == described
    if period == ctx.period:
        assert torch.equal(tokens, ctx.repeated[: shape[0]])
    else:  # drawn from seed + 1, so it is not a prefix of the shared batch
        assert period == 6
        redrawn = repeated_random_tokens(1, 6, 3, 30, torch.Generator().manual_seed(5), bos_token_id=bos)
        assert torch.equal(tokens, redrawn)


@pytest.mark.parametrize(
    ("limit", "bos", "shape", "described"),
    [
        (1e9, None, (32, 31), "corpus (eval split)"),
        (300.0, None, (9, 31), "corpus (eval split) (9 x 31 tokens)"),
        (20.0, BOS, (1, 20), "corpus (eval split) after the start token (1 x 20 tokens)"),
    ],
)
def test_rerun_text_takes_the_first_windows_and_positions(monkeypatch, limit, bos, shape, described):
    monkeypatch.setattr(context, "RERUN_FLOP_BUDGET", limit)
    ctx = context_of(random_model(dataclasses.replace(CFG, bos_token_id=bos)), CORPUS)
    tokens, description = ctx.rerun_text(per_token)
    assert torch.equal(tokens, ctx.text[: shape[0], : shape[1]]) and description == described


@pytest.mark.parametrize(("limit", "sequences"), [(300.0, 5), (20.0, 2), (1.0, 1)])
def test_rerun_user_takes_whole_sequences_at_least_one(monkeypatch, limit, sequences):
    monkeypatch.setattr(context, "RERUN_FLOP_BUDGET", limit)
    tokens = torch.arange(35).reshape(5, 7) % 30
    user = UserTokens(tokens, tokens.roll(-1, 1), "my.npy")
    ctx = context_of(random_model(CFG), user=user)
    got, targets, description = ctx.rerun_user(per_token)
    assert torch.equal(got, tokens[:sequences]) and torch.equal(targets, tokens.roll(-1, 1)[:sequences])
    assert description == ("my.npy" if sequences == 5 else f"my.npy ({sequences} x 7 tokens)")


def test_the_repeat_period_fits_the_shortest_sliding_window():
    """An induction head reads ``period - 1`` tokens back; a layer with a window of ``w`` sees
    ``w - 1`` back, so the repeats' period is at most the shortest window."""
    cfg = dataclasses.replace(CFG, n_layers=2, layer_windows=(None, 4))
    ctx = context_of(qkov.AttnOnlyTransformer(cfg))
    assert ctx.period == 4 and ctx.repeated.shape[1] == 3 * 4
    allowed = qkov.AttnOnlyTransformer(cfg).blocks[1].attn.mask(12, torch.device("cpu"))
    assert allowed[11, 11 - (ctx.period - 1)] and not allowed[11, 11 - ctx.period]
    assert context_of(qkov.AttnOnlyTransformer(CFG)).period == 10  # no window: the context decides


def test_a_long_context_is_read_on_its_first_positions():
    """A model of Llama 3's 131,072 positions draws repeats and corpus windows of at most
    ``MAX_SEQUENCE`` tokens: periods of 341, cut further only by the cache budget."""
    cfg = dataclasses.replace(CFG, n_ctx=131072, bos_token_id=BOS)
    corpus = TokenSplits(RNG.integers(0, 29, 3000), RNG.integers(0, 29, 3000))
    ctx = context_of(qkov.AttnOnlyTransformer(cfg), corpus)
    assert context.MAX_SEQUENCE == 1024 and ctx.period == (1024 - 1) // 3
    assert ctx.repeated.shape[1] == 1 + 3 * ctx.period and ctx.text.shape[1] == 1024
