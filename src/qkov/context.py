"""What every analysis step reads (:mod:`qkov.analyze`): the model, its folded form for the
weight-based circuits, the corpus tokens and the user's own tokens when given, and the random token
batches every step shares, drawn once from a seed and cut to the compute and memory budgets
(:mod:`qkov.circuits.budget`) with a description of what was used."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import Any, Protocol

import torch
from torch import Tensor

from qkov.circuits.attribution_patching import Attribution, estimate_ablations, estimate_and_rerun_flop
from qkov.circuits.bigrams import BigramCounts
from qkov.circuits.budget import TRUSTED, batch_shape, cache_bytes
from qkov.config import Config
from qkov.data.random_tokens import repeated_random_tokens
from qkov.data.tokens import sample_windows
from qkov.data.user_tokens import UserTokens
from qkov.interop.fold import circuit_model
from qkov.model import AttnOnlyTransformer

REPEATS = 3  # repeated random tokens: each sequence is a random period repeated this often
REPEAT_BATCH = 32
# The head scores' run kept every pattern, head write and logit of its batch (run_with_cache), so
# its batch is cut to fit this (circuits/budget.py), down to budget.TRUSTED: at GPT-2 small's shapes
# and n_ctx 1024 one sequence of 1023 tokens caches about 1.7 GB, so the batch is 8 sequences of
# period 57 (172 tokens with the start token, 1.4 GB); the default models' 32 x 126 tokens take
# about 0.1 GB and are not cut. The run now keeps the patterns and logits alone; the budget is
# unchanged, so that the batch, and the scores, are those of earlier versions (at Llama-3.2-1B's
# shapes the floor of 8 x 128 tokens no longer holds 4 GiB of head writes).
REPEATED_CACHE_BYTES = 1.5 * 2**30
# Ablations and term importance rerun the model (or its unembedding) many times per token: each runs
# on a batch cut to this many FLOP (circuits/budget.py), down to budget.TRUSTED (8 x 128 tokens)
# where a step asks for it; the default models need under 0.1 TFLOP and are not cut.
RERUN_FLOP_BUDGET = 1e12
PATTERN_EXAMPLE_LENGTH = 48  # tokens in the attention-pattern examples kept for the report
# The longest sequence a behaviour step draws (GPT-2's context): a model with a longer one is read on
# its first positions. The budgets above bound a batch's cache, not what later steps build from it
# in float64 (the circuit graph's centred scores, several [batch, heads, pos, pos] at once), which
# grows as the square of the length: a 2-layer Llama of width 64 with Llama 3's 131,072 positions
# drew periods of 789 (2,368 tokens) and its full analyze took 4 min 11 s and 15.8 GB.
MAX_SEQUENCE = 1024


class CorpusSplits(Protocol):
    """A tokenized corpus: its train and held-out token ids (arrays, or sharded tokens: ``len()``
    and contiguous slices are all the steps read)."""

    @property
    def train(self) -> Any: ...

    @property
    def eval(self) -> Any: ...


@dataclass(frozen=True)
class Context:
    """What every step reads. Build it with :meth:`of`, which draws the random inputs once, in a fixed
    order, from ``seed``, on the CPU (the same tokens whatever the model's device), then moves them
    to the model's device:

    - ``repeated``: the first ``REPEAT_BATCH`` sequences of ``period`` random tokens repeated
      ``REPEATS`` times that fit ``REPEATED_CACHE_BYTES`` (at least ``TRUSTED``, a shorter period
      when fewer sequences would not reach it);
    - ``example``: one such sequence of ``example_period`` tokens (``PATTERN_EXAMPLE_LENGTH`` in all);
    - with a corpus, ``snippet`` (one eval window of that length) and ``text`` (``REPEAT_BATCH``
      eval windows of ``n_ctx``, at most ``MAX_SEQUENCE``);
    - ``user``: the user's own tokens and targets (``--tokens``), when given.

    A model with a start token (``cfg.bos_token_id``) reads it first in every sequence: the repeats
    (then of period ``(n_ctx - 1) // REPEATS``, ``n_ctx`` at most ``MAX_SEQUENCE``), the example
    and the corpus windows; ``start`` is 1, the position the repeats begin at, from which their
    scores and losses are read.

    Steps that rerun the model many times take a part of these within ``RERUN_FLOP_BUDGET``
    (:meth:`rerun_batch`, :meth:`rerun_text`). ``done`` holds the results of the steps run so far.
    With ``weights_only`` (``qkov analyze --weights-only``) no batch is drawn: the steps read the
    weights alone."""

    model: AttnOnlyTransformer
    corpus: CorpusSplits | None
    seed: int
    period: int
    example_period: int
    repeated: Tensor | None = None
    example: Tensor | None = None
    snippet: Tensor | None = None
    text: Tensor | None = None
    done: Mapping[str, Any] = field(default_factory=dict)
    user: UserTokens | None = None
    start: int = 0
    weights_only: bool = False

    @classmethod
    def of(
        cls,
        model: AttnOnlyTransformer,
        corpus: CorpusSplits | None,
        seed: int,
        done: Mapping[str, Any],
        user: UserTokens | None = None,
        weights_only: bool = False,
    ) -> Context:
        cfg, generator, device = model.cfg, torch.Generator().manual_seed(seed), model.device
        bos, start = cfg.bos_token_id, int(cfg.bos_token_id is not None)
        n_ctx = min(cfg.n_ctx, MAX_SEQUENCE)
        period = min((n_ctx - start) // REPEATS, _reach(cfg))
        example_period = (min(PATTERN_EXAMPLE_LENGTH, cfg.n_ctx) - start) // REPEATS
        if cfg.n_layers == 0 or weights_only:
            return cls(
                model, corpus, seed, period, example_period, done=done, user=user, start=start,
                weights_only=weights_only,
            )  # fmt: skip
        full, cache = (REPEAT_BATCH, period), partial(cache_bytes, cfg)
        sequences, period = batch_shape(full, REPEATS, cache, REPEATED_CACHE_BYTES, TRUSTED)
        draw = partial(repeated_random_tokens, repeats=REPEATS, d_vocab=cfg.d_vocab, generator=generator)
        repeated = draw(REPEAT_BATCH, period, bos_token_id=bos)[:sequences]
        example = draw(1, example_period, bos_token_id=bos)[0]
        snippet = text = None
        if corpus is not None:
            snippet = _windows(corpus, 1, min(PATTERN_EXAMPLE_LENGTH, cfg.n_ctx), generator, bos)[0]
            text = _windows(corpus, REPEAT_BATCH, n_ctx, generator, bos).to(device)
            snippet = snippet.to(device)
        repeated, example = repeated.to(device), example.to(device)
        return cls(
            model, corpus, seed, period, example_period, repeated, example, snippet, text, done, user, start
        )

    @cached_property
    def circuit(self) -> AttnOnlyTransformer:
        """The model the weight-based circuits read, folded once (:func:`circuit_model`)."""
        return circuit_model(self.model)

    @cached_property
    def counts(self) -> BigramCounts:
        assert self.corpus is not None
        return BigramCounts.of(self.corpus.train, self.model.cfg.d_vocab)

    @cached_property
    def attribution(self) -> Attribution:
        """Every ablation's first-order estimate (:mod:`qkov.circuits.attribution_patching`), on
        the ablations' batch: ``repeated`` cut to ``RERUN_FLOP_BUDGET`` for the estimate and its
        least exact reruns, down to ``TRUSTED``. Computed once, for the step that reruns the
        ablations it ranks highest and the one that reports it beside them."""
        cost = partial(estimate_and_rerun_flop, self.model.cfg)
        tokens, period, described = self.rerun_batch(cost, TRUSTED)
        return estimate_ablations(self.model, tokens, period, self.start, described)

    def rerun_batch(
        self, cost: Callable[[int], float], least: tuple[int, int] = (1, 0)
    ) -> tuple[Tensor, int, str]:
        """``(tokens, period, description)`` for a step that costs ``cost(length)`` FLOP per token:
        ``repeated`` when it fits ``RERUN_FLOP_BUDGET``, else its first sequences that fit (down to
        ``least = (sequences, tokens)``, :func:`batch_shape`), else sequences of a shorter period
        drawn from ``seed + 1``."""
        assert self.repeated is not None
        full = (len(self.repeated), self.period)
        sequences, period = batch_shape(full, REPEATS, cost, RERUN_FLOP_BUDGET, least)
        described = "repeated random tokens" + (f" of period {period}" if period != self.period else "")
        cfg = self.model.cfg
        if period == self.period:
            tokens = self.repeated[:sequences]
        else:
            generator = torch.Generator().manual_seed(self.seed + 1)
            bos = cfg.bos_token_id
            drawn = repeated_random_tokens(sequences, period, REPEATS, cfg.d_vocab, generator, bos)
            tokens = drawn.to(self.model.device)
        described += " after the start token" if self.start else ""
        return tokens, period, _cut(described, tokens, (full[0], self.start + REPEATS * full[1]))

    def rerun_text(self, cost: Callable[[int], float], least: tuple[int, int] = (1, 0)) -> tuple[Tensor, str]:
        """The first of the ``text`` windows, and their first positions, that fit
        ``RERUN_FLOP_BUDGET`` for a step costing ``cost(length)`` FLOP per token (down to ``least``,
        :func:`batch_shape`), and their description."""
        assert self.text is not None
        sequences, length = batch_shape(tuple(self.text.shape), 1, cost, RERUN_FLOP_BUDGET, least)
        tokens = self.text[:sequences, :length]
        described = "corpus (eval split)" + (" after the start token" if self.start else "")
        return tokens, _cut(described, tokens, tuple(self.text.shape))

    def rerun_user(self, cost: Callable[[int], float]) -> tuple[Tensor, Tensor, str]:
        """``(tokens, targets, description)``: the user's first sequences (whole, at least one) that
        fit ``RERUN_FLOP_BUDGET`` for a step costing ``cost(length)`` FLOP per token."""
        assert self.user is not None
        sequences, _ = batch_shape(tuple(self.user.tokens.shape), 1, cost, RERUN_FLOP_BUDGET)
        tokens = self.user.tokens[:sequences].to(self.model.device)
        targets = self.user.targets[:sequences].to(self.model.device)
        return tokens, targets, _cut(self.user.description, tokens, tuple(self.user.tokens.shape))


def _reach(cfg: Config) -> int:
    """The longest repeat period an induction head can see across: a query in a layer with a sliding
    window of ``w`` positions reads at most ``w - 1`` tokens back, and an induction head attends
    ``period - 1`` back (to the token after the previous occurrence)."""
    windows = [w for w in cfg.layer_windows or () if w is not None]
    return min(windows) if windows else cfg.n_ctx


def _windows(
    corpus: CorpusSplits, count: int, length: int, generator: torch.Generator, bos: int | None
) -> Tensor:
    """``count`` eval windows of ``length`` tokens: with a start token, the token and ``length - 1``
    of text, as the model read text in training."""
    if bos is None:
        return sample_windows(corpus.eval, count, length, generator)
    windows = sample_windows(corpus.eval, count, length - 1, generator)
    return torch.cat([torch.full_like(windows[:, :1], bos), windows], dim=1)


def _cut(described: str, tokens: Tensor, full: tuple[int, ...]) -> str:
    """A batch's description, saying how far it was cut to a budget."""
    cut = tuple(tokens.shape) != tuple(full)
    return described + (f" ({tokens.shape[0]} x {tokens.shape[1]} tokens)" if cut else "")
