"""Every analysis that applies to a model, run as a list of registered steps (the paper's sections
"Zero-Layer", "One-Layer" and "Two-Layer Attention-Only Transformers").

A step is a small function from a :class:`Context` (the model, its folded form for the weight-based
circuits, the corpus tokens, the random token batches every step shares, and the results of the
steps it reads) to the typed result its circuits function returns; :data:`STEPS` declares each
one's name (the ``Results`` field it fills), which models it applies to, the steps it reads, its
progress weight and its title (the progress line and the report section's heading). :func:`analyze`
runs the steps that apply; the progress total is the sum of their weights. To add an analysis, see
"Adding an analysis" in the README.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property, partial
from types import MappingProxyType
from typing import Any, Protocol

import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from tokenizers import Tokenizer
from torch import Tensor

from qkov.circuits.ablation import ablation_effects, ablation_flop
from qkov.circuits.bigrams import BigramCounts, compare_bigrams
from qkov.circuits.budget import batch_shape, cache_bytes
from qkov.circuits.composition import composition, induction_checks
from qkov.circuits.copying import compare_copying, copying_analysis, default_direct_copying
from qkov.circuits.heads import AttentionExamples, attention_example
from qkov.circuits.paths import term_importance, term_importance_flop
from qkov.circuits.phase_change import phase_change
from qkov.circuits.qk_ov import qk_position_content
from qkov.circuits.repeated import repeated_token_behaviour
from qkov.circuits.skip_trigrams import skip_trigram_tables
from qkov.circuits.spectra import all_spectra
from qkov.circuits.task import task_flop, task_performance
from qkov.config import Config
from qkov.data.random_tokens import repeated_random_tokens
from qkov.data.tokens import sample_windows
from qkov.data.user_tokens import UserTokens
from qkov.errors import QkovError
from qkov.interop.fold import circuit_model
from qkov.model import AttnOnlyTransformer
from qkov.results import Results
from qkov.training_log import TrainingPoint

REPEATS = 3  # repeated random tokens: each sequence is a random period repeated this often
REPEAT_BATCH = 32
# The head scores' run keeps every pattern, head write and logit of its batch (run_with_cache), so
# its sequences are cut to fit this (circuits/budget.py): at GPT-2 small's shapes and n_ctx 1024 one
# sequence of 1023 tokens caches about 1.7 GB, so 1 of the 32 (the step took 2.0 GB above the model
# and the whole `qkov analyze` peaked at 3.0 GB, benchmarks/analyze_gpt2.py); the default models'
# 32 x 126 tokens take about 0.1 GB and are not cut.
REPEATED_CACHE_BYTES = 3 * 2**30
# Ablations and term importance rerun the model (or its unembedding) many times per token: each runs
# on a repeated-token batch cut to this many FLOP (circuits/budget.py). At GPT-2 small's shapes that
# is 1 sequence of 21 tokens (period 7) for the 264 ablations and of 72 (period 24) for term
# importance, 9 and 11 s on this 2-core machine (benchmarks/analyze_gpt2.py), which keeps the whole
# analysis near one minute; the default models need under 0.1 TFLOP and are not cut.
RERUN_FLOP_BUDGET = 1e12
SPECTRUM_TOP_K = 10  # singular values kept per head
SKIP_TRIGRAMS_PER_HEAD = 50
MIN_TOKEN_COUNT = 20  # with a corpus, skip-trigrams use only tokens seen this often (rare rows are noise)
PATTERN_EXAMPLE_LENGTH = 48  # tokens in the attention-pattern examples kept for the report


def token_strings(tokenizer: Tokenizer | None, d_vocab: int) -> list[str]:
    """How each token reads: its decoded text, or ``#id`` without a tokenizer."""
    if tokenizer is None:
        return [f"#{i}" for i in range(d_vocab)]
    return [tokenizer.decode([i]) for i in range(d_vocab)]


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
      ``REPEATS`` times that fit ``REPEATED_CACHE_BYTES``;
    - ``example``: one such sequence of ``example_period`` tokens (``PATTERN_EXAMPLE_LENGTH`` in all);
    - with a corpus, ``snippet`` (one eval window of that length) and ``text`` (``REPEAT_BATCH``
      eval windows of ``n_ctx``);
    - ``user``: the user's own tokens and targets (``--tokens``), when given.

    A model with a start token (``cfg.bos_token_id``) reads it first in every sequence: the repeats
    (then of period ``(n_ctx - 1) // REPEATS``), the example and the corpus windows; ``start`` is 1,
    the position the repeats begin at, from which their scores and losses are read.

    Steps that rerun the model many times take a part of these within ``RERUN_FLOP_BUDGET``
    (:meth:`rerun_batch`, :meth:`rerun_text`). ``done`` holds the results of the steps run so far."""

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

    @classmethod
    def of(
        cls,
        model: AttnOnlyTransformer,
        corpus: CorpusSplits | None,
        seed: int,
        done: Mapping[str, Any],
        user: UserTokens | None = None,
    ) -> Context:
        cfg, generator, device = model.cfg, torch.Generator().manual_seed(seed), model.device
        bos, start = cfg.bos_token_id, int(cfg.bos_token_id is not None)
        period = (cfg.n_ctx - start) // REPEATS
        example_period = (min(PATTERN_EXAMPLE_LENGTH, cfg.n_ctx) - start) // REPEATS
        if cfg.n_layers == 0:
            return cls(model, corpus, seed, period, example_period, done=done, user=user, start=start)
        full, cache = (REPEAT_BATCH, period), partial(cache_bytes, cfg)
        sequences, period = batch_shape(full, REPEATS, cache, REPEATED_CACHE_BYTES)
        draw = partial(repeated_random_tokens, repeats=REPEATS, d_vocab=cfg.d_vocab, generator=generator)
        repeated = draw(REPEAT_BATCH, period, bos_token_id=bos)[:sequences]
        example = draw(1, example_period, bos_token_id=bos)[0]
        snippet = text = None
        if corpus is not None:
            snippet = _windows(corpus, 1, min(PATTERN_EXAMPLE_LENGTH, cfg.n_ctx), generator, bos)[0]
            text = _windows(corpus, REPEAT_BATCH, cfg.n_ctx, generator, bos).to(device)
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

    def rerun_batch(self, cost: Callable[[int], float]) -> tuple[Tensor, int, str]:
        """``(tokens, period, description)`` for a step that costs ``cost(length)`` FLOP per token:
        ``repeated`` when it fits ``RERUN_FLOP_BUDGET``, else its first sequences that fit, else
        (when not even one does) sequences of a shorter period drawn from ``seed + 1``."""
        assert self.repeated is not None
        full = (len(self.repeated), self.period)
        sequences, period = batch_shape(full, REPEATS, cost, RERUN_FLOP_BUDGET)
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

    def rerun_text(self, cost: Callable[[int], float]) -> tuple[Tensor, str]:
        """The first of the ``text`` windows, and their first positions, that fit
        ``RERUN_FLOP_BUDGET`` for a step costing ``cost(length)`` FLOP per token, and their
        description."""
        assert self.text is not None
        sequences, length = batch_shape(tuple(self.text.shape), 1, cost, RERUN_FLOP_BUDGET)
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


@dataclass(frozen=True)
class Step:
    """One analysis: ``run(context)`` returns the ``Results`` field ``name``. It applies to models of
    ``min_layers`` to ``max_layers`` layers; only with a corpus when ``needs_corpus``; only with the
    user's data (``--tokens``) when ``needs_user_data``; only to a model whose outputs are its input
    tokens (a square token-to-token circuit, or the next token as target) when ``needs_square``;
    and, when ``needs_targets``, to a model whose targets are known: the next token (its outputs
    are tokens) or the user's. ``reads`` names the steps whose results it reads; ``weight`` is its
    share of the progress bar."""

    name: str
    title: str
    run: Callable[[Context], Any]
    min_layers: int = 0
    max_layers: int | None = None
    needs_corpus: bool = False
    reads: tuple[str, ...] = ()
    weight: int = 1
    needs_square: bool = False
    needs_user_data: bool = False
    needs_targets: bool = False

    def skip_reason(self, cfg: Config, has_corpus: bool, has_user_data: bool = False) -> str | None:
        """Why the step does not apply to a model of ``cfg`` with this data, in a few words; None
        when it applies."""
        outputs = f"the model has {cfg.d_out} outputs (d_vocab_out) for {cfg.d_vocab} input tokens"
        square = f"needs a square token-to-token circuit: {outputs}"
        reasons = (
            (cfg.n_layers < self.min_layers, f"needs at least {self.min_layers} layer(s)"),
            (self.max_layers is not None and cfg.n_layers > self.max_layers,
             f"applies to models of at most {self.max_layers} layer(s)"),
            (self.needs_corpus and not has_corpus, "needs a corpus (--corpus)"),
            (self.needs_user_data and not has_user_data, "needs the user's data (--tokens)"),
            (self.needs_square and not cfg.outputs_tokens, square),
            (self.needs_targets and not (cfg.outputs_tokens or has_user_data),
             f"needs targets: {outputs}, so give them (--tokens, --targets)"),
        )  # fmt: skip
        return next((reason for failed, reason in reasons if failed), None)


# -- the steps: behavioural ones run ``ctx.model``, weight-based ones read ``ctx.circuit`` ---------
def attention_step(ctx: Context) -> AttentionExamples:
    after = " after the start token" if ctx.start else ""
    repeated = f"repeated random tokens ({ctx.example_period} tokens, {REPEATS} times{after})"
    snippet = f"a corpus snippet ({len(ctx.snippet)} tokens)" if ctx.snippet is not None else ""
    corpus = attention_example(ctx.model, ctx.snippet, snippet) if ctx.snippet is not None else None
    user = None
    if ctx.user is not None:
        first = ctx.user.tokens[0, :PATTERN_EXAMPLE_LENGTH].to(ctx.model.device)
        user = attention_example(ctx.model, first, f"the first sequence of {ctx.user.description}")
    return AttentionExamples(attention_example(ctx.model, ctx.example, repeated), corpus, user)


def term_importance_step(ctx: Context):
    """On the user's tokens and targets when given, else on corpus text, else on repeated tokens."""
    cost = partial(term_importance_flop, ctx.model.cfg)
    if ctx.user is not None:
        tokens, targets, described = ctx.rerun_user(cost)
        return term_importance(ctx.model, tokens, described, targets)
    tokens, *_, described = ctx.rerun_text(cost) if ctx.corpus is not None else ctx.rerun_batch(cost)
    return term_importance(ctx.model, tokens, described)


def task_step(ctx: Context):
    return task_performance(ctx.model, *ctx.rerun_user(partial(task_flop, ctx.model.cfg)))


def skip_trigram_step(ctx: Context):
    allowed = None if ctx.corpus is None else torch.from_numpy(ctx.counts.unigram >= MIN_TOKEN_COUNT)
    corpus = None if ctx.corpus is None else ctx.corpus.train
    return skip_trigram_tables(ctx.circuit, SKIP_TRIGRAMS_PER_HEAD, allowed, corpus)


def ablation_step(ctx: Context):
    tokens, period, _ = ctx.rerun_batch(partial(ablation_flop, ctx.model.cfg))
    return ablation_effects(ctx.model, tokens, period, start=ctx.start)


STEPS: tuple[Step, ...] = (
    Step(
        "bigram", "Direct path as a bigram table", lambda ctx: compare_bigrams(ctx.model, ctx.counts),
        needs_corpus=True, needs_square=True,
    ),
    Step("spectra", "Spectra of every head", lambda ctx: all_spectra(ctx.circuit, SPECTRUM_TOP_K), 1),
    Step(
        "copying_direct", "Direct copying measures", lambda ctx: default_direct_copying(ctx.circuit), 1,
        weight=2, needs_square=True,
    ),
    Step(
        "copying", "Copying (OV eigenvalues)", lambda ctx: copying_analysis(ctx.circuit), 1,
        needs_square=True,
    ),
    Step(
        "copying_comparison", "Eigenvalues against direct copying",
        lambda ctx: compare_copying(ctx.done["copying"], ctx.done["copying_direct"]), 1,
        reads=("copying_direct", "copying"), needs_square=True,
    ),
    Step(
        "repeated_tokens", "Repeated random tokens",
        lambda ctx: repeated_token_behaviour(
            ctx.model, ctx.repeated, ctx.period, REPEATS, ctx.model.cfg.bos_token_id
        ), 1, needs_square=True,
    ),
    Step("attention_examples", "Attention patterns", attention_step, 1),
    Step("qk_position_content", "Position versus content", lambda ctx: qk_position_content(ctx.circuit), 1),
    Step("term_importance", "Term importance", term_importance_step, 1, weight=2, needs_targets=True),
    Step("skip_trigrams", "Skip-trigrams", skip_trigram_step, 1, max_layers=1, weight=2, needs_square=True),
    Step("composition", "Composition scores", lambda ctx: composition(ctx.circuit), 2),
    Step(
        "induction_check", "Induction mechanism (K-composition)",
        lambda ctx: induction_checks(ctx.circuit, ctx.done["copying"]), 2, reads=("copying",),
        needs_square=True,
    ),
    Step("ablation", "Ablations", ablation_step, 2, weight=2, needs_square=True),
    Step("task", "The user's task (loss, accuracy, ablations)", task_step, weight=2, needs_user_data=True),
)  # fmt: skip


# -- running them ----------------------------------------------------------------------------------
def _progress(show: bool) -> Progress:
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"))
    return Progress(*columns, TimeElapsedColumn(), console=Console(stderr=True), disable=not show)


def analyze(
    model: AttnOnlyTransformer,
    corpus_tokens: CorpusSplits | None = None,
    training_log: list[TrainingPoint] | None = None,
    show_progress: bool = True,
    seed: int = 0,
    user_tokens: UserTokens | None = None,
) -> Results:
    """Run every step that applies to the model. ``corpus_tokens`` (train and eval token ids, in the
    model's tokenizer) adds the bigram comparison, marks skip-trigram bugs that never occur, and
    gives the text for term importance; without it term importance uses repeated random tokens.
    ``user_tokens`` (:func:`qkov.data.user_tokens.read_user_tokens`) adds the task step and an
    attention example, and term importance runs on them against their targets. ``Results.skipped``
    says why each other step did not run.
    Every step computes where the model's weights are (``model.to("cuda")`` to analyse on a GPU)."""
    cfg = model.cfg
    reasons = {s.name: s.skip_reason(cfg, corpus_tokens is not None, user_tokens is not None) for s in STEPS}
    steps = [name for name, reason in reasons.items() if reason is None]
    done = run_steps(model, steps, corpus_tokens, seed, show_progress, user_tokens)
    log = training_log or []
    strings = token_strings(model.tokenizer, cfg.d_vocab)
    skipped = {name: reason for name, reason in reasons.items() if reason is not None}
    return Results(
        config=cfg, tokens=strings, training=log, phase_change=phase_change(log), skipped=skipped, **done
    )


def run_steps(
    model: AttnOnlyTransformer,
    names: list[str],
    corpus_tokens: CorpusSplits | None = None,
    seed: int = 0,
    show_progress: bool = False,
    user_tokens: UserTokens | None = None,
) -> dict[str, Any]:
    """Run the named steps, and the steps they read, in registry order, on the same seeded inputs
    as :func:`analyze`: ``{name: result}`` for every step run. ``qkov serve`` uses it to answer with
    exactly the numbers ``analyze`` writes."""
    unknown = sorted(set(names) - {s.name for s in STEPS})
    if unknown:
        raise QkovError(f"no analysis step {', '.join(unknown)}")
    wanted = set(names)
    for step in reversed(STEPS):  # a step's dependencies come before it, so one backward pass suffices
        if step.name in wanted:
            wanted |= set(step.reads)
    steps = [s for s in STEPS if s.name in wanted]
    model = model.eval()
    done: dict[str, Any] = {}
    ctx = Context.of(model, corpus_tokens, seed, MappingProxyType(done), user_tokens)
    with _progress(show_progress) as progress, torch.no_grad():
        task = progress.add_task("analysing", total=sum(s.weight for s in steps))
        for step in steps:
            progress.update(task, description=f"analysing: {step.title}")
            done[step.name] = step.run(ctx)
            progress.advance(task, step.weight)
    return done
