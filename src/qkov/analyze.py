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
from dataclasses import dataclass, field, replace
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
from qkov.circuits.bug_cost import bug_cost, bug_cost_flop
from qkov.circuits.composition import composition, induction_checks
from qkov.circuits.copying import compare_copying, copying_analysis, default_direct_copying
from qkov.circuits.heads import AttentionExamples, attention_example
from qkov.circuits.paths import term_importance, term_importance_flop
from qkov.circuits.phase_change import TrainingPoint, phase_change
from qkov.circuits.qk_ov import qk_position_content
from qkov.circuits.repeated import repeated_token_behaviour
from qkov.circuits.skip_trigrams import skip_trigram_tables
from qkov.circuits.spectra import all_spectra
from qkov.data.random_tokens import repeated_random_tokens
from qkov.data.tokens import sample_windows
from qkov.errors import QkovError
from qkov.interop.fold import circuit_model
from qkov.model import AttnOnlyTransformer
from qkov.results import Results

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
      eval windows of ``n_ctx``).

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

    @classmethod
    def of(
        cls, model: AttnOnlyTransformer, corpus: CorpusSplits | None, seed: int, done: Mapping[str, Any]
    ) -> Context:
        cfg, generator, device = model.cfg, torch.Generator().manual_seed(seed), model.device
        period, example_period = cfg.n_ctx // REPEATS, min(PATTERN_EXAMPLE_LENGTH, cfg.n_ctx) // REPEATS
        if cfg.n_layers == 0:
            return cls(model, corpus, seed, period, example_period, done=done)
        full, cache = (REPEAT_BATCH, period), partial(cache_bytes, cfg)
        sequences, period = batch_shape(full, REPEATS, cache, REPEATED_CACHE_BYTES)
        repeated = repeated_random_tokens(REPEAT_BATCH, period, REPEATS, cfg.d_vocab, generator)[:sequences]
        example = repeated_random_tokens(1, example_period, REPEATS, cfg.d_vocab, generator)[0]
        snippet = text = None
        if corpus is not None:
            snippet = sample_windows(corpus.eval, 1, min(PATTERN_EXAMPLE_LENGTH, cfg.n_ctx), generator)[0]
            text = sample_windows(corpus.eval, REPEAT_BATCH, cfg.n_ctx, generator).to(device)
            snippet = snippet.to(device)
        repeated, example = repeated.to(device), example.to(device)
        return cls(model, corpus, seed, period, example_period, repeated, example, snippet, text, done)

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
        if period == self.period:
            tokens = self.repeated[:sequences]
        else:
            generator = torch.Generator().manual_seed(self.seed + 1)
            drawn = repeated_random_tokens(sequences, period, REPEATS, self.model.cfg.d_vocab, generator)
            tokens = drawn.to(self.model.device)
        return tokens, period, _cut(described, tokens, (full[0], REPEATS * full[1]))

    def rerun_text(self, cost: Callable[[int], float]) -> tuple[Tensor, str]:
        """The first of the ``text`` windows, and their first positions, that fit
        ``RERUN_FLOP_BUDGET`` for a step costing ``cost(length)`` FLOP per token, and their
        description."""
        assert self.text is not None
        sequences, length = batch_shape(tuple(self.text.shape), 1, cost, RERUN_FLOP_BUDGET)
        tokens = self.text[:sequences, :length]
        return tokens, _cut("corpus (eval split)", tokens, tuple(self.text.shape))


def _cut(described: str, tokens: Tensor, full: tuple[int, ...]) -> str:
    """A batch's description, saying how far it was cut to a budget."""
    cut = tuple(tokens.shape) != tuple(full)
    return described + (f" ({tokens.shape[0]} x {tokens.shape[1]} tokens)" if cut else "")


@dataclass(frozen=True)
class Step:
    """One analysis: ``run(context)`` returns the ``Results`` field ``name``. It applies to models of
    ``min_layers`` to ``max_layers`` layers, and only with a corpus when ``needs_corpus``. ``reads``
    names the steps whose results it reads; ``weight`` is its share of the progress bar."""

    name: str
    title: str
    run: Callable[[Context], Any]
    min_layers: int = 0
    max_layers: int | None = None
    needs_corpus: bool = False
    reads: tuple[str, ...] = ()
    weight: int = 1

    def applies(self, n_layers: int, has_corpus: bool) -> bool:
        deep_enough = n_layers >= self.min_layers and (self.max_layers is None or n_layers <= self.max_layers)
        return deep_enough and (has_corpus or not self.needs_corpus)


# -- the steps: behavioural ones run ``ctx.model``, weight-based ones read ``ctx.circuit`` ---------
def attention_step(ctx: Context) -> AttentionExamples:
    repeated = f"repeated random tokens ({ctx.example_period} tokens, {REPEATS} times)"
    snippet = f"a corpus snippet ({len(ctx.snippet)} tokens)" if ctx.snippet is not None else ""
    corpus = attention_example(ctx.model, ctx.snippet, snippet) if ctx.snippet is not None else None
    return AttentionExamples(attention_example(ctx.model, ctx.example, repeated), corpus)


def term_importance_step(ctx: Context):
    cost = partial(term_importance_flop, ctx.model.cfg)
    tokens, *_, described = ctx.rerun_text(cost) if ctx.corpus is not None else ctx.rerun_batch(cost)
    return term_importance(ctx.model, tokens, described)


def skip_trigram_step(ctx: Context):
    allowed = None if ctx.corpus is None else torch.from_numpy(ctx.counts.unigram >= MIN_TOKEN_COUNT)
    corpus = None if ctx.corpus is None else ctx.corpus.train
    found = skip_trigram_tables(ctx.circuit, SKIP_TRIGRAMS_PER_HEAD, allowed, corpus)
    if ctx.text is None or ctx.circuit.cfg.has_layer_norm:  # the bug cost is defined without LayerNorm
        return found
    tokens, described = ctx.rerun_text(partial(bug_cost_flop, ctx.model.cfg))
    return replace(found, bug_cost=bug_cost(ctx.circuit, found.bugs, tokens, described))


def ablation_step(ctx: Context):
    tokens, period, _ = ctx.rerun_batch(partial(ablation_flop, ctx.model.cfg))
    return ablation_effects(ctx.model, tokens, period)


STEPS: tuple[Step, ...] = (
    Step(
        "bigram", "Direct path as a bigram table", lambda ctx: compare_bigrams(ctx.model, ctx.counts),
        needs_corpus=True,
    ),
    Step("spectra", "Spectra of every head", lambda ctx: all_spectra(ctx.circuit, SPECTRUM_TOP_K), 1),
    Step(
        "copying_direct", "Direct copying measures", lambda ctx: default_direct_copying(ctx.circuit), 1,
        weight=2,
    ),
    Step("copying", "Copying (OV eigenvalues)", lambda ctx: copying_analysis(ctx.circuit), 1),
    Step(
        "copying_comparison", "Eigenvalues against direct copying",
        lambda ctx: compare_copying(ctx.done["copying"], ctx.done["copying_direct"]), 1,
        reads=("copying_direct", "copying"),
    ),
    Step(
        "repeated_tokens", "Repeated random tokens",
        lambda ctx: repeated_token_behaviour(ctx.model, ctx.repeated, ctx.period, REPEATS), 1,
    ),
    Step("attention_examples", "Attention patterns", attention_step, 1),
    Step("qk_position_content", "Position versus content", lambda ctx: qk_position_content(ctx.circuit), 1),
    Step("term_importance", "Term importance", term_importance_step, 1, weight=2),
    Step("skip_trigrams", "Skip-trigrams", skip_trigram_step, 1, max_layers=1, weight=2),
    Step("composition", "Composition scores", lambda ctx: composition(ctx.circuit), 2),
    Step(
        "induction_check", "Induction mechanism (K-composition)",
        lambda ctx: induction_checks(ctx.circuit, ctx.done["copying"]), 2, reads=("copying",),
    ),
    Step("ablation", "Ablations", ablation_step, 2, weight=2),
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
) -> Results:
    """Run every step that applies to the model. ``corpus_tokens`` (train and eval token ids, in the
    model's tokenizer) adds the bigram comparison, marks skip-trigram bugs that never occur, and
    gives the text for term importance; without it term importance uses repeated random tokens.
    Every step computes where the model's weights are (``model.to("cuda")`` to analyse on a GPU)."""
    cfg = model.cfg
    steps = [s.name for s in STEPS if s.applies(cfg.n_layers, corpus_tokens is not None)]
    done = run_steps(model, steps, corpus_tokens, seed, show_progress)
    log = training_log or []
    strings = token_strings(model.tokenizer, cfg.d_vocab)
    return Results(config=cfg, tokens=strings, training=log, phase_change=phase_change(log), **done)


def run_steps(
    model: AttnOnlyTransformer,
    names: list[str],
    corpus_tokens: CorpusSplits | None = None,
    seed: int = 0,
    show_progress: bool = False,
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
    ctx = Context.of(model, corpus_tokens, seed, MappingProxyType(done))
    with _progress(show_progress) as progress, torch.no_grad():
        task = progress.add_task("analysing", total=sum(s.weight for s in steps))
        for step in steps:
            progress.update(task, description=f"analysing: {step.title}")
            done[step.name] = step.run(ctx)
            progress.advance(task, step.weight)
    return done
