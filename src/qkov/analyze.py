"""Every analysis that applies to a model, run as a list of registered steps (the paper's sections
"Zero-Layer", "One-Layer" and "Two-Layer Attention-Only Transformers").

A step is a small function from a :class:`Context` (the model, the corpus tokens, the random token
batches every step shares, and the results of the steps before it, read-only) to one typed result
of :mod:`qkov.results`; :data:`STEPS` declares each one's name (the ``Results`` field it fills),
which models it applies to, its progress weight and its title (the progress line and the report
section's heading). :func:`analyze` runs the steps that apply; the progress total is the sum of
their weights. To add an analysis, see "Adding an analysis" in the README.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property, partial
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from tokenizers import Tokenizer

from qkov.checkpoint import load
from qkov.circuits.ablation import ablation_effects, ablation_flop, repeat_behaviour
from qkov.circuits.bigrams import BigramCounts, compare_bigrams
from qkov.circuits.budget import batch_shape, cache_bytes
from qkov.circuits.composition import (
    KINDS,
    all_raw_composition_scores,
    composition_baseline,
    k_composition_positivity,
)
from qkov.circuits.copying import compare_copying, copying_analysis, default_direct_copying
from qkov.circuits.heads import (
    INDUCTION_HEAD,
    PREVIOUS_TOKEN_HEAD,
    duplicate_token_scores,
    previous_token_scores,
)
from qkov.circuits.paths import term_importance, term_importance_flop
from qkov.circuits.phase_change import phase_change
from qkov.circuits.qk_ov import qk_term_rms
from qkov.circuits.skip_trigrams import (
    head_circuits,
    skip_trigram_bugs,
    skip_trigram_occurs,
    strongest_skip_trigrams,
)
from qkov.circuits.spectra import head_spectra
from qkov.data.random_tokens import repeated_random_tokens
from qkov.data.shards import corpus_tokens
from qkov.data.tokens import sample_windows
from qkov.errors import QkovError
from qkov.io import atomic_write_text
from qkov.machine import compute_device
from qkov.model import AttnOnlyTransformer
from qkov.names import head_name, hook_name
from qkov.report import render_report
from qkov.results import (
    AttentionExample,
    AttentionExamples,
    Composition,
    CompositionPair,
    Copying,
    CrossedRow,
    HeadBehaviour,
    HeadCopying,
    InductionCheck,
    RepeatedTokens,
    Results,
    SkipTrigramBugRow,
    SkipTrigramRow,
    SkipTrigrams,
    Spectra,
    TermImportanceResult,
    finite,
    write_results,
)
from qkov.training_log import TrainingPoint, read_training_log

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
SKIP_TRIGRAMS_PER_HEAD = 50
MIN_TOKEN_COUNT = 20  # with a corpus, skip-trigrams use only tokens seen this often (rare rows are noise)
PATTERN_EXAMPLE_LENGTH = 48  # tokens in the attention-pattern examples kept for the report


def token_strings(tokenizer: Tokenizer | None, d_vocab: int) -> list[str]:
    """How each token reads: its decoded text, or ``#id`` without a tokenizer."""
    if tokenizer is None:
        return [f"#{i}" for i in range(d_vocab)]
    return [tokenizer.decode([i]) for i in range(d_vocab)]


@dataclass
class Context:
    """What every step reads. The random inputs are drawn once, in a fixed order, from ``seed``:
    ``repeated`` (``REPEAT_BATCH`` sequences of a period repeated ``REPEATS`` times, the first of them
    that fit ``REPEATED_CACHE_BYTES``), ``example`` (one such sequence of at most
    ``PATTERN_EXAMPLE_LENGTH`` tokens) and, with a corpus, ``snippet`` (one eval window) and ``text``
    (``REPEAT_BATCH`` eval windows). Steps that rerun the model many times take a part of these
    within ``RERUN_FLOP_BUDGET`` (:meth:`rerun_batch`, :meth:`rerun_text`). They are drawn on the
    CPU, so they are the same tokens whatever the model's device, and then moved there."""

    model: AttnOnlyTransformer
    corpus: tuple[np.ndarray, np.ndarray] | None  # train and eval token arrays
    strings: list[str]
    seed: int = 0
    done: Mapping[str, Any] = field(default_factory=dict)  # earlier steps' results, read-only

    def __post_init__(self) -> None:
        cfg, generator = self.model.cfg, torch.Generator().manual_seed(self.seed)
        self.period = cfg.n_ctx // REPEATS
        self.example_period = min(PATTERN_EXAMPLE_LENGTH, cfg.n_ctx) // REPEATS
        if cfg.n_layers == 0:
            return
        full, cache = (REPEAT_BATCH, self.period), partial(cache_bytes, cfg)
        sequences, self.period = batch_shape(full, REPEATS, cache, REPEATED_CACHE_BYTES)
        drawn = repeated_random_tokens(REPEAT_BATCH, self.period, REPEATS, cfg.d_vocab, generator)
        device = self.model.device
        self.repeated = drawn[:sequences].to(device)
        example = repeated_random_tokens(1, self.example_period, REPEATS, cfg.d_vocab, generator)
        self.example = example[0].to(device)
        if self.corpus is not None:
            length = min(PATTERN_EXAMPLE_LENGTH, cfg.n_ctx)
            self.snippet = sample_windows(self.corpus[1], 1, length, generator)[0].to(device)
            self.text = sample_windows(self.corpus[1], REPEAT_BATCH, cfg.n_ctx, generator).to(device)

    def rerun_batch(self, cost: Callable[[int], float]) -> tuple[torch.Tensor, int]:
        """``(tokens, period)`` for a step that costs ``cost(length)`` FLOP per token: ``repeated``
        when it fits ``RERUN_FLOP_BUDGET``, else its first sequences that fit, else (when not
        even one does) sequences of a shorter period drawn from ``seed + 1``."""
        cfg = self.model.cfg
        sequences, period = batch_shape((len(self.repeated), self.period), REPEATS, cost, RERUN_FLOP_BUDGET)
        if period == self.period:
            return self.repeated[:sequences], period
        generator = torch.Generator().manual_seed(self.seed + 1)
        tokens = repeated_random_tokens(sequences, period, REPEATS, cfg.d_vocab, generator)
        return tokens.to(self.model.device), period

    def rerun_text(self, cost: Callable[[int], float]) -> torch.Tensor:
        """The first of the ``text`` windows, and their first positions, that fit
        ``RERUN_FLOP_BUDGET`` for a step costing ``cost(length)`` FLOP per token."""
        sequences, length = batch_shape(tuple(self.text.shape), 1, cost, RERUN_FLOP_BUDGET)
        return self.text[:sequences, :length]

    @cached_property
    def counts(self) -> BigramCounts:
        assert self.corpus is not None
        return BigramCounts.of(self.corpus[0], self.model.cfg.d_vocab)


@dataclass(frozen=True)
class Step:
    """One analysis: ``run(context)`` returns the ``Results`` field ``name``. It applies to models of
    ``min_layers`` to ``max_layers`` layers, and only with a corpus when ``needs_corpus``. ``after``
    names the steps whose results it reads; ``weight`` is its share of the progress bar."""

    name: str
    title: str
    run: Callable[[Context], Any]
    min_layers: int = 0
    max_layers: int | None = None
    needs_corpus: bool = False
    after: tuple[str, ...] = ()
    weight: int = 1

    def applies(self, n_layers: int, has_corpus: bool) -> bool:
        deep_enough = n_layers >= self.min_layers and (self.max_layers is None or n_layers <= self.max_layers)
        return deep_enough and (has_corpus or not self.needs_corpus)


# -- the steps -------------------------------------------------------------------------------------
def bigram_step(ctx: Context):
    return compare_bigrams(ctx.model, ctx.counts)


SPECTRUM_TOP_K = 10  # singular values kept per head


def spectra_step(ctx: Context) -> Spectra:
    return Spectra(
        head_spectra(ctx.model, "OV", SPECTRUM_TOP_K), head_spectra(ctx.model, "QK", SPECTRUM_TOP_K)
    )


def copying_direct_step(ctx: Context):
    return default_direct_copying(ctx.model)  # (inside analyze's progress display: no bar of its own)


def copying_comparison_step(ctx: Context):
    return compare_copying(ctx.done["spectra"].OV, ctx.done["copying_direct"])


def copying_step(ctx: Context) -> Copying:
    copying = copying_analysis(ctx.model, direct=ctx.done["copying_direct"])
    heads = [
        HeadCopying(
            name=head_name(layer, head),
            layer=layer,
            head=head,
            copying_score=finite(copying.scores[layer, head]),
            self_top1=finite(copying.self_top1[layer, head]),
            diagonal_z=finite(copying.diagonal_z[layer, head]),
            eigenvalues=[
                (round(e.real, 5), round(e.imag, 5)) for e in copying.eigenvalues[layer, head].tolist()
            ],
            copies=bool(copying.scores[layer, head] > copying.threshold),
        )
        for layer, head in np.ndindex(copying.scores.shape)
    ]
    return Copying(
        heads=heads,
        baseline=[round(float(x), 4) for x in copying.baseline],
        baseline_mean=float(copying.baseline.mean()),
        threshold=copying.threshold,
        copying_heads=copying.copying_heads,
    )


def repeated_tokens_step(ctx: Context) -> RepeatedTokens:
    logits, cache = ctx.model.run_with_cache(ctx.repeated)
    behaviour = repeat_behaviour(logits, cache, ctx.repeated, ctx.period)
    previous, duplicate = previous_token_scores(cache), duplicate_token_scores(cache, ctx.period)
    heads = [
        HeadBehaviour(
            name=head_name(layer, head),
            layer=layer,
            head=head,
            previous_token_score=finite(previous[layer, head]),
            induction_score=finite(behaviour.induction[layer][head]),
            duplicate_token_score=finite(duplicate[layer, head]),
        )
        for layer, head in np.ndindex(previous.shape)
    ]
    return RepeatedTokens(
        period=ctx.period,
        repeats=REPEATS,
        sequences=ctx.repeated.shape[0],
        loss_per_repeat=behaviour.loss_per_repeat,
        heads=heads,
        previous_token_threshold=PREVIOUS_TOKEN_HEAD,
        induction_threshold=INDUCTION_HEAD,
        previous_token_heads=[h.name for h in heads if (h.previous_token_score or 0) > PREVIOUS_TOKEN_HEAD],
        induction_heads=[h.name for h in heads if (h.induction_score or 0) > INDUCTION_HEAD],
    )


def _patterns(model: AttnOnlyTransformer, tokens: torch.Tensor, description: str) -> AttentionExample:
    _, cache = model.run_with_cache(tokens[None])
    patterns = {}
    for layer in range(model.cfg.n_layers):
        for head, pattern in enumerate(cache[hook_name(layer, "pattern")][0]):
            rows = [[round(float(x), 3) for x in row[: i + 1]] for i, row in enumerate(pattern)]
            patterns[head_name(layer, head)] = rows
    return AttentionExample(description, tokens.tolist(), patterns)


def attention_step(ctx: Context) -> AttentionExamples:
    repeated = _patterns(
        ctx.model, ctx.example, f"repeated random tokens ({ctx.example_period} tokens, {REPEATS} times)"
    )
    corpus = None
    if ctx.corpus is not None:
        corpus = _patterns(ctx.model, ctx.snippet, f"a corpus snippet ({len(ctx.snippet)} tokens)")
    return AttentionExamples(repeated, corpus)


def position_content_step(ctx: Context) -> dict[str, dict[str, float]] | None:
    if ctx.model.W_pos is None:
        return None
    rms = qk_term_rms(ctx.model)
    return {
        term: {head_name(layer, head): float(v) for (layer, head), v in np.ndenumerate(values.cpu().numpy())}
        for term, values in rms.items()
    }


def term_importance_step(ctx: Context) -> TermImportanceResult:
    cost = partial(term_importance_flop, ctx.model.cfg)
    if ctx.corpus is not None:
        tokens, described, full = ctx.rerun_text(cost), "corpus (eval split)", ctx.text.shape
    else:
        (tokens, period), described = ctx.rerun_batch(cost), "repeated random tokens"
        full = (len(ctx.repeated), REPEATS * ctx.period)
        if period != ctx.period:
            described += f" of period {period}"
    if tokens.shape != full:  # cut to the budget: say how far
        described += f" ({tokens.shape[0]} x {tokens.shape[1]} tokens)"
    importance = term_importance(ctx.model, tokens)
    return TermImportanceResult(**importance.__dict__, tokens=described)


def _trigram_rows(
    ctx: Context, layer: int, head: int
) -> tuple[list[SkipTrigramRow], list[SkipTrigramBugRow]]:
    allowed = torch.from_numpy(ctx.counts.unigram >= MIN_TOKEN_COUNT) if ctx.corpus is not None else None
    circuits = head_circuits(ctx.model, layer, head, allowed)
    trigrams = strongest_skip_trigrams(circuits, SKIP_TRIGRAMS_PER_HEAD)
    s = ctx.strings
    rows = [
        SkipTrigramRow(
            **t.__dict__, source_str=s[t.source], destination_str=s[t.destination], out_str=s[t.out]
        )
        for t in trigrams
    ]
    bugs = []
    for bug in skip_trigram_bugs(circuits, trigrams):
        crossed = [
            CrossedRow(
                **replace(c, in_corpus=_in_corpus(ctx, bug.source, c.destination, c.out)).__dict__,
                destination_str=s[c.destination],
                out_str=s[c.out],
            )
            for c in bug.crossed
        ]
        first_str, second_str = ((s[d], s[o]) for d, o in (bug.first, bug.second))
        bugs.append(
            SkipTrigramBugRow(
                **(bug.__dict__ | {"crossed": crossed}),
                source_str=s[bug.source],
                first_str=first_str,
                second_str=second_str,
            )
        )
    return rows, bugs


def _in_corpus(ctx: Context, source: int, destination: int, out: int) -> bool | None:
    if ctx.corpus is None:
        return None
    return skip_trigram_occurs(ctx.corpus[0], source, destination, out, ctx.model.cfg.n_ctx)


def skip_trigram_step(ctx: Context) -> SkipTrigrams:
    tables, bugs = {}, {}
    for head in range(ctx.model.cfg.n_heads):
        tables[head_name(0, head)], bugs[head_name(0, head)] = _trigram_rows(ctx, 0, head)
    return SkipTrigrams(tables, bugs)


def composition_step(ctx: Context) -> Composition:
    baseline = composition_baseline(ctx.model.cfg.d_model, ctx.model.cfg.d_head)
    pairs = {
        kind: [
            CompositionPair(head_name(l1, h1), head_name(l2, h2), float(raw), baseline, float(raw) - baseline)
            for (l1, h1, l2, h2), raw in np.ndenumerate(scores.cpu().numpy())
            if not math.isnan(raw)
        ]
        for kind, scores in all_raw_composition_scores(ctx.model, KINDS).items()
    }
    return Composition(baseline=baseline, **pairs)


def induction_check_step(ctx: Context) -> list[InductionCheck]:
    positivity = k_composition_positivity(ctx.model)
    copying = {h.name: h.copying_score for h in ctx.done["copying"].heads}
    n_heads, rows = ctx.model.cfg.n_heads, []
    for layer in range(1, ctx.model.cfg.n_layers):
        for head in range(n_heads):
            per_writer = positivity[:layer, :, layer, head].flatten()  # [earlier layers * n_heads]
            best = int(per_writer.argmax())
            rows.append(
                InductionCheck(
                    head=head_name(layer, head),
                    ov_copying=copying[head_name(layer, head)],
                    k_composition_positivity=float(per_writer[best]),
                    writer=head_name(*divmod(best, n_heads)),
                    all={head_name(*divmod(i, n_heads)): float(v) for i, v in enumerate(per_writer)},
                )
            )
    return rows


def ablation_step(ctx: Context):
    tokens, period = ctx.rerun_batch(partial(ablation_flop, ctx.model.cfg))
    return ablation_effects(ctx.model, tokens, period)


STEPS: tuple[Step, ...] = (
    Step("bigram", "Direct path as a bigram table", bigram_step, needs_corpus=True),
    Step("spectra", "Spectra of every head", spectra_step, min_layers=1),
    Step("copying_direct", "Direct copying measures", copying_direct_step, min_layers=1, weight=2),
    Step("copying", "Copying (OV eigenvalues)", copying_step, min_layers=1, after=("copying_direct",)),
    Step(
        "copying_comparison",
        "Eigenvalues against direct copying",
        copying_comparison_step,
        min_layers=1,
        after=("spectra", "copying_direct"),
    ),
    Step("repeated_tokens", "Repeated random tokens", repeated_tokens_step, min_layers=1),
    Step("attention_examples", "Attention patterns", attention_step, min_layers=1),
    Step("qk_position_content", "Position versus content", position_content_step, min_layers=1),
    Step("term_importance", "Term importance", term_importance_step, min_layers=1, weight=2),
    Step("skip_trigrams", "Skip-trigrams", skip_trigram_step, min_layers=1, max_layers=1, weight=2),
    Step("composition", "Composition scores", composition_step, min_layers=2),
    Step(
        "induction_check", "Induction mechanism (K-composition)", induction_check_step, 2, after=("copying",)
    ),
    Step("ablation", "Ablations", ablation_step, min_layers=2, weight=2),
)


# -- running them ----------------------------------------------------------------------------------
def _progress(show: bool) -> Progress:
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"))
    return Progress(*columns, TimeElapsedColumn(), console=Console(stderr=True), disable=not show)


def analyze(
    model: AttnOnlyTransformer,
    corpus_tokens: tuple[np.ndarray, np.ndarray] | None = None,
    training_log: list[TrainingPoint] | None = None,
    show_progress: bool = True,
    seed: int = 0,
) -> Results:
    """Run every step that applies to the model. ``corpus_tokens`` (train and eval arrays, in the
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
    corpus_tokens: tuple[np.ndarray, np.ndarray] | None = None,
    seed: int = 0,
    show_progress: bool = False,
) -> dict[str, Any]:
    """Run the named steps, and the steps they read (``after``), in registry order, on the same
    seeded inputs as :func:`analyze`: ``{name: result}`` for every step run. ``qkov serve`` uses it
    to answer with exactly the numbers ``analyze`` writes."""
    unknown = sorted(set(names) - {s.name for s in STEPS})
    if unknown:
        raise QkovError(f"no analysis step {', '.join(unknown)}")
    wanted = set(names)
    for step in reversed(STEPS):  # a step's dependencies come before it, so one backward pass suffices
        if step.name in wanted:
            wanted |= set(step.after)
    steps = [s for s in STEPS if s.name in wanted]
    model = model.eval()
    done: dict[str, Any] = {}
    strings = token_strings(model.tokenizer, model.cfg.d_vocab)
    ctx = Context(model, corpus_tokens, strings, seed, MappingProxyType(done))
    with _progress(show_progress) as progress, torch.no_grad():
        task = progress.add_task("analysing", total=sum(s.weight for s in steps))
        for step in steps:
            progress.update(task, description=f"analysing: {step.title}")
            done[step.name] = step.run(ctx)
            progress.advance(task, step.weight)
    return done


def corpus_token_arrays(
    patterns: list[str] | None, tokenizer: Tokenizer | None
) -> tuple[np.ndarray, np.ndarray]:
    """The train and eval token arrays of a corpus (``["stdlib"]``: the embedded default), in the
    checkpoint's tokenizer (cached like training's)."""
    if tokenizer is None:
        raise QkovError("--corpus needs a checkpoint with a tokenizer.json to read text")
    splits = corpus_tokens(patterns, tokenizer)
    return splits.train, splits.eval


def analyze_checkpoint(
    checkpoint: str | Path,
    out: Path,
    corpus: list[str] | None = None,
    seed: int = 0,
    show_progress: bool = True,
    device: str = "cpu",
) -> Results:
    """``qkov analyze``: load, analyse on ``device``, write ``out/results.json`` and
    ``out/report.html``."""
    model = load(checkpoint).to(compute_device(device))
    corpus_tokens = corpus_token_arrays(corpus, model.tokenizer) if corpus else None
    results = analyze(model, corpus_tokens, read_training_log(Path(checkpoint)), show_progress, seed)
    out.mkdir(parents=True, exist_ok=True)
    write_results(results, out)
    atomic_write_text(out / "report.html", render_report({f"{model.cfg.n_layers}-layer": results}))
    return results
