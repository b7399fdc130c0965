"""Every analysis that applies to a model, run as a list of registered steps (the paper's sections
"Zero-Layer", "One-Layer" and "Two-Layer Attention-Only Transformers").

A step is a small function from a :class:`Context` (the model, its folded form for the weight-based
circuits, the corpus tokens, the random token batches every step shares, and the results of the
steps it reads) to the typed result its circuits function returns; :data:`STEPS` declares each
one's name (the ``Results`` field it fills), which models it applies to, the steps it reads, its
progress weight and its title (the progress line and the report section's heading), and whether
it reads tokens or the weights alone. :func:`analyze` runs the steps that apply, or those chosen
(``--steps``, ``--weights-only``: :func:`plan_steps`); the progress total is the sum of their
weights. To add an analysis, see "Adding an analysis" in docs/house.md.

The module is callable: ``qkov.analyze(model)`` (or ``qkov.analyze("folder")``) is
:func:`analyze_model`, the front door, while ``from qkov import analyze; analyze.run_steps(...)``
and ``from qkov.analyze import analyze`` keep working.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import Any

import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from qkov import context
from qkov.circuits.ablation import ablation_effects, within_budget
from qkov.circuits.attribution_patching import EXACT_AT_LEAST, ablation_estimate
from qkov.circuits.bigrams import compare_bigrams
from qkov.circuits.budget import TRUSTED
from qkov.circuits.bug_cost import bug_cost, bug_cost_flop
from qkov.circuits.circuit import circuit_flop, circuit_graph, head_roles
from qkov.circuits.composition import composition, induction_checks
from qkov.circuits.copying import compare_copying, copying_analysis, default_direct_copying
from qkov.circuits.correction import correction, correction_flop
from qkov.circuits.groups import group_similarity
from qkov.circuits.heads import AttentionExamples, attention_example
from qkov.circuits.mechanisms import induction_mechanism_flop, induction_mechanisms
from qkov.circuits.neurons import neuron_analysis, neuron_flop
from qkov.circuits.paths import term_importance, term_importance_flop
from qkov.circuits.phase_change import phase_change
from qkov.circuits.qk_ov import qk_position_content
from qkov.circuits.repeated import repeated_token_behaviour
from qkov.circuits.rotary_bands import rotary_bands
from qkov.circuits.skip_trigrams import skip_trigram_tables
from qkov.circuits.spectra import all_spectra
from qkov.circuits.task import task_flop, task_performance
from qkov.config import Config
from qkov.context import PATTERN_EXAMPLE_LENGTH, REPEATS, Context, CorpusSplits
from qkov.data.tokenizer import token_strings
from qkov.data.user_tokens import UserTokens
from qkov.errors import QkovError
from qkov.interop import open_model
from qkov.interop.fold import circuit_notes
from qkov.interop.lazy import WHOLE_ENDS_BYTES
from qkov.model import AttnOnlyTransformer
from qkov.results import EVERY_STEP, Results, StepsRun
from qkov.sizes import check_weight_magnitudes
from qkov.tall import TallMatrix
from qkov.training_log import TrainingPoint, read_training_log

SPECTRUM_TOP_K = 10  # singular values kept per head
SKIP_TRIGRAMS_PER_HEAD = 50
MIN_TOKEN_COUNT = 20  # with a corpus, skip-trigrams use only tokens seen this often (rare rows are noise)


WEIGHTS, TOKENS, EITHER = "weights", "tokens", "weights, or tokens where the run has them"


@dataclass(frozen=True)
class Step:
    """One analysis: ``run(context)`` returns the ``Results`` field ``name``. It applies to models of
    ``min_layers`` to ``max_layers`` layers; only with a corpus when ``needs_corpus``; only with the
    user's data (``--tokens``) when ``needs_user_data``; only to a model whose outputs are its input
    tokens (a square token-to-token circuit, or the next token as target) when ``needs_square``;
    and, when ``needs_targets``, to a model whose targets are known: the next token (its outputs
    are tokens) or the user's; and only to a model with MLPs when ``needs_mlp``. ``reads`` names
    the steps whose results it reads; ``weight`` is its share of the progress bar. ``inputs`` says
    what it reads besides the weights (``--weights-only`` runs the steps that need nothing more):
    ``WEIGHTS`` nothing (no forward pass, no tokens), ``TOKENS`` tokens (it runs the model on them,
    or reads the corpus), ``EITHER`` tokens where the run has them (a corpus, the user's data, the
    random batches), else the weights alone. ``narrow_ends``: it reads the embedding and the
    unembedding only through :meth:`~qkov.model.Transformer.outer_factors` (or not at all), so it
    runs on a lazy model that holds them narrow (:func:`qkov.interop.lazy.narrow_ends`)."""

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
    needs_mlp: bool = False
    needs_feature: str | None = None
    not_under: tuple[str, ...] = ()
    inputs: str = "weights"
    narrow_ends: bool = False

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
            (self.needs_mlp and not cfg.has_mlp, "needs MLPs: the model is attention-only (d_mlp 0)"),
            (self.needs_feature is not None and self.needs_feature not in cfg.features,
             f"needs {self.needs_feature}"),
            (bool(set(self.not_under) & set(cfg.features)), _not_under(self.not_under, cfg)),
        )  # fmt: skip
        return next((reason for failed, reason in reasons if failed), None)


def _not_under(features: tuple[str, ...], cfg: Config) -> str:
    """Why a step does not run under one of the model's features: its algebra assumes the paper's
    attention or a sequential block, and would not be exact."""
    first = next((f for f in cfg.features if f in features), None)
    return "" if first is None else f"not exact under {first}: this analysis assumes {NOT_UNDER_WHY[first]}"


NOT_UNDER_WHY = {
    "rotary positions": "unrotated queries and keys",
    "query and key norms": "scores bilinear in the residual stream",
    "attention soft-capping": "scores bilinear in the residual stream",
    "norms after each sublayer": "writes that join the stream unnormalised",
    "logit soft-capping": "logits linear in the final residual stream",
}
# what the score-attribution steps (a head's scores split by what writes its queries and keys) and
# path expansion cannot handle yet
SCORE_ATTRIBUTION = ("attention soft-capping",)
PATHS = ("logit soft-capping",)
NEURONS = ("norms after each sublayer", *PATHS)


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
    """On the user's tokens and targets when given, else on corpus text, else on repeated tokens
    (either at least ``TRUSTED``)."""
    cost = partial(term_importance_flop, ctx.model.cfg)
    if ctx.user is not None:
        tokens, targets, described = ctx.rerun_user(cost)
        return term_importance(ctx.model, tokens, described, targets)
    cut = ctx.rerun_text(cost, TRUSTED) if ctx.corpus is not None else ctx.rerun_batch(cost, TRUSTED)
    tokens, described = cut[0], cut[-1]
    return term_importance(ctx.model, tokens, described)


def neuron_step(ctx: Context):
    """The last layer on the user's tokens and targets, else on corpus text or repeated tokens (its
    next tokens); weights only for a model whose outputs are not tokens and without the user's."""
    cost = partial(neuron_flop, ctx.model.cfg)
    if ctx.user is not None:
        tokens, targets, described = ctx.rerun_user(cost)
        return neuron_analysis(ctx.model, tokens, described, targets, circuit=ctx.circuit)
    if ctx.weights_only or not ctx.model.cfg.outputs_tokens:
        return neuron_analysis(ctx.model, circuit=ctx.circuit)
    tokens, *_, described = ctx.rerun_text(cost) if ctx.corpus is not None else ctx.rerun_batch(cost)
    return neuron_analysis(ctx.model, tokens, described, circuit=ctx.circuit)


def task_step(ctx: Context):
    return task_performance(ctx.model, *ctx.rerun_user(partial(task_flop, ctx.model.cfg)))


def skip_trigram_step(ctx: Context):
    allowed = None if ctx.corpus is None else torch.from_numpy(ctx.counts.unigram >= MIN_TOKEN_COUNT)
    corpus = None if ctx.corpus is None else ctx.corpus.train
    found = skip_trigram_tables(ctx.circuit, SKIP_TRIGRAMS_PER_HEAD, allowed, corpus)
    if ctx.text is None or ctx.circuit.cfg.has_layer_norm:  # the bug cost is defined without LayerNorm
        return found
    tokens, described = ctx.rerun_text(partial(bug_cost_flop, ctx.model.cfg))
    covers = (
        f"the crossings among each head's {SKIP_TRIGRAMS_PER_HEAD} strongest skip-trigrams only: a lower "
        "bound on what every skip-trigram bug costs"
    )
    cost = bug_cost(ctx.circuit, found.bugs, tokens, described)
    return replace(found, bug_cost=replace(cost, covers=covers))


def ablation_step(ctx: Context):
    """Every ablation rerun exactly where they all fit ``context.RERUN_FLOP_BUDGET``, else those the
    first-order estimate ranks highest (at least ``EXACT_AT_LEAST``), on the estimate's batch."""
    found = ctx.attribution
    budget = context.RERUN_FLOP_BUDGET  # the one budget of every rerun, read where the batches are cut
    only = within_budget(ctx.model.cfg, found.tokens, found.ranking(), budget, EXACT_AT_LEAST)
    return ablation_effects(ctx.model, found.tokens, found.period, found.clean_run, ctx.start, only)


def induction_mechanism_step(ctx: Context):
    heads = ctx.done["repeated_tokens"].induction_heads
    cost = partial(induction_mechanism_flop, ctx.model.cfg, heads=len(heads))
    tokens, period, described = ctx.rerun_batch(cost)
    return induction_mechanisms(ctx.model, tokens, period, heads, described)


def correction_step(ctx: Context):
    found = ctx.done["repeated_tokens"]
    tokens, period, described = ctx.rerun_batch(partial(correction_flop, ctx.model.cfg))
    heads = (found.induction_heads, found.previous_token_heads)
    return correction(ctx.model, tokens, period, *heads, described, start=ctx.start)


def circuit_step(ctx: Context):
    roles = head_roles(ctx.done["repeated_tokens"], ctx.done["copying"], ctx.done["correction"])
    tokens, _, described = ctx.rerun_batch(partial(circuit_flop, ctx.model.cfg))
    return circuit_graph(ctx.model, tokens, roles, described)


STEPS: tuple[Step, ...] = (
    Step(
        "bigram", "Direct path as a bigram table", lambda ctx: compare_bigrams(ctx.model, ctx.counts),
        needs_corpus=True, needs_square=True, inputs=TOKENS,
    ),
    Step("spectra", "Spectra of every head", lambda ctx: all_spectra(ctx.circuit, SPECTRUM_TOP_K), 1,
         narrow_ends=True),
    Step(
        "copying_direct", "Direct copying measures", lambda ctx: default_direct_copying(ctx.circuit), 1,
        weight=2, needs_square=True,
    ),
    Step(
        "copying", "Copying (OV eigenvalues)", lambda ctx: copying_analysis(ctx.circuit), 1,
        needs_square=True, narrow_ends=True,
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
        ), 1, needs_square=True, inputs=TOKENS,
    ),
    Step("attention_examples", "Attention patterns", attention_step, 1, inputs=TOKENS),
    Step("qk_position_content", "Position versus content", lambda ctx: qk_position_content(ctx.circuit), 1),
    Step("rotary_bands", "Rotary heads by frequency", lambda ctx: rotary_bands(ctx.model), 1,
         needs_feature="rotary positions", narrow_ends=True),
    Step("gqa_groups", "Grouped-query attention: heads of a group side by side",
         lambda ctx: group_similarity(ctx.model), 1, needs_feature="grouped-query attention",
         narrow_ends=True),
    Step("term_importance", "Term importance", term_importance_step, 1, weight=2, needs_targets=True,
         not_under=PATHS, inputs=TOKENS),
    Step("skip_trigrams", "Skip-trigrams", skip_trigram_step, 1, max_layers=1, weight=2, needs_square=True,
         inputs=EITHER),
    Step("composition", "Composition scores", lambda ctx: composition(ctx.circuit), 2, narrow_ends=True),
    Step(
        "induction_check", "Induction mechanism (K-composition)",
        lambda ctx: induction_checks(ctx.circuit, ctx.done["copying"]), 2, reads=("copying",),
        needs_square=True, narrow_ends=True,
    ),
    Step(
        "induction_mechanism", "Induction mechanism (score attribution)", induction_mechanism_step, 2,
        reads=("repeated_tokens",), needs_square=True, not_under=SCORE_ATTRIBUTION, inputs=TOKENS,
    ),
    Step(
        "correction", "The corrected composition picture", correction_step, 1, reads=("repeated_tokens",),
        needs_square=True, not_under=SCORE_ATTRIBUTION, inputs=TOKENS,
    ),
    Step(
        "circuit", "The circuit graph", circuit_step, 2, reads=("repeated_tokens", "copying", "correction"),
        needs_square=True, not_under=SCORE_ATTRIBUTION, inputs=TOKENS,
    ),
    Step("ablation", "Ablations", ablation_step, 2, weight=2, needs_square=True, inputs=TOKENS),
    Step("neurons", "MLP neurons (keys and values)", neuron_step, 1, weight=2, needs_mlp=True,
         not_under=NEURONS, inputs=EITHER),
    Step(
        "ablation_estimate", "Ablations, estimated to first order",
        lambda ctx: ablation_estimate(ctx.attribution, ctx.done["ablation"]), 2, reads=("ablation",),
        needs_square=True, inputs=TOKENS,
    ),
    Step("task", "The user's task (loss, accuracy, ablations)", task_step, weight=2, needs_user_data=True,
         inputs=TOKENS),
)  # fmt: skip
STEP_NAMES = tuple(step.name for step in STEPS)
NARROW_REASON = (
    f"reads the embedding or unembedding whole: this lazy model holds them narrow (more than "
    f"{WHOLE_ENDS_BYTES / 2**30:g} GiB in float32)"
)


def holds_narrow(model: AttnOnlyTransformer) -> bool:
    """Whether ``model`` holds its embedding and unembedding narrow (a lazy model of a wide
    vocabulary: :func:`qkov.interop.lazy.narrow_ends`), so that only the steps that read them
    through :meth:`~qkov.model.Transformer.outer_factors` run on it."""
    return isinstance(model.outer_factors()[0], TallMatrix)


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
    steps: Sequence[str] | None = None,
    weights_only: bool = False,
) -> Results:
    """Run every step that applies to the model. ``corpus_tokens`` (train and eval token ids, in the
    model's tokenizer) adds the bigram comparison, marks skip-trigram bugs that never occur, and
    gives the text for term importance; without it term importance uses repeated random tokens.
    ``user_tokens`` (:func:`qkov.data.user_tokens.read_user_tokens`) adds the task step and an
    attention example, and term importance runs on them against their targets. ``steps`` runs only
    the steps named (and those they read); ``weights_only`` only those that read the weights alone,
    no forward pass and no tokens (:func:`plan_steps`). ``Results.steps`` says which ran and how
    they were chosen, ``Results.skipped`` why each other step did not run.
    Every step computes where the model's weights are (``model.to("cuda")`` to analyse on a GPU)."""
    cfg, narrow = model.cfg, holds_narrow(model)
    plan, skipped = plan_steps(
        cfg, corpus_tokens is not None, user_tokens is not None, steps, weights_only, narrow
    )
    done = run_steps(model, plan.ran, corpus_tokens, seed, show_progress, user_tokens, weights_only)
    log = training_log or []
    strings = token_strings(model.tokenizer, cfg.d_vocab)
    return Results(
        config=cfg, tokens=strings, training=log, phase_change=phase_change(log), skipped=skipped,
        circuit_notes=circuit_notes(cfg), steps=plan, **done,
    )  # fmt: skip


def check_selection(
    names: Sequence[str] | None, weights_only: bool, has_corpus: bool = False, has_user_data: bool = False
) -> None:
    """One line, before any model is read, for a choice of steps that cannot be run: a name that is
    no step (the line lists the steps), a named step that reads tokens under ``weights_only``, or
    tokens given with ``weights_only``."""
    if names is not None:
        unknown = [name for name in names if name not in STEP_NAMES]
        if unknown or not names:
            what = f"no step {', '.join(unknown)}" if unknown else "name at least one step"
            raise QkovError(f"--steps: {what} (the steps: {', '.join(STEP_NAMES)})")
    if not weights_only:
        return
    if has_corpus or has_user_data:
        given = ", ".join(f for f, held in (("--corpus", has_corpus), ("--tokens", has_user_data)) if held)
        raise QkovError(f"--weights-only reads no tokens: leave out {given}")
    reading = [name for name in names or () if STEPS[STEP_NAMES.index(name)].inputs == TOKENS]
    if reading:
        alone = [s.name for s in STEPS if s.inputs != TOKENS]
        raise QkovError(
            f"--steps {', '.join(reading)}: runs the model on tokens, which --weights-only leaves out "
            f"(the steps that read the weights alone: {', '.join(alone)})"
        )


def plan_steps(
    cfg: Config,
    has_corpus: bool,
    has_user_data: bool = False,
    names: Sequence[str] | None = None,
    weights_only: bool = False,
    narrow: bool = False,
) -> tuple[StepsRun, dict[str, str]]:
    """Which steps run, in registry order, and why each other one does not. The steps are those
    named (``names``, each with the steps it reads, which run too and are said to: ``added``),
    else all; with ``weights_only``, of those, the ones whose ``inputs`` are not ``TOKENS``; of
    those, the ones that apply to the model and data (:meth:`Step.skip_reason`), to a model that
    holds its ends narrow when ``narrow`` (:attr:`Step.narrow_ends`), and whose every read step
    runs. Refuses what :func:`check_selection` refuses."""
    check_selection(names, weights_only, has_corpus, has_user_data)
    wanted = _with_reads(names) if names is not None else set(STEP_NAMES)
    skipped: dict[str, str] = {}
    for step in STEPS:
        unread = [name for name in step.reads if name in skipped]
        reasons = (
            None if step.name in wanted else "not among --steps",
            "reads tokens, not the weights alone (--weights-only)" if weights_only and step.inputs == TOKENS
            else None,
            step.skip_reason(cfg, has_corpus, has_user_data),
            NARROW_REASON if narrow and not step.narrow_ends else None,
            f"reads {', '.join(unread)}, which did not run" if unread else None,
        )  # fmt: skip
        reason = next((r for r in reasons if r is not None), None)
        if reason is not None:
            skipped[step.name] = reason
    ran = [s.name for s in STEPS if s.name not in skipped]
    added = {
        name: "read by " + ", ".join(s.name for s in STEPS if s.name in ran and name in s.reads)
        for name in ran
        if names is not None and name not in names
    }
    return StepsRun(_chosen(names, weights_only), ran, added), skipped


def _with_reads(names: Sequence[str]) -> set[str]:
    wanted = set(names)
    for step in reversed(STEPS):  # a step's dependencies come before it, so one backward pass suffices
        if step.name in wanted:
            wanted |= set(step.reads)
    return wanted


def _chosen(names: Sequence[str] | None, weights_only: bool) -> str:
    alone = "the steps that read the weights alone (--weights-only)"
    if names is None:
        return alone if weights_only else EVERY_STEP
    return f"the steps named (--steps {','.join(names)})" + (f", of {alone}" if weights_only else "")


def run_steps(
    model: AttnOnlyTransformer,
    names: list[str],
    corpus_tokens: CorpusSplits | None = None,
    seed: int = 0,
    show_progress: bool = False,
    user_tokens: UserTokens | None = None,
    weights_only: bool = False,
) -> dict[str, Any]:
    """Run the named steps, and the steps they read, in registry order, on the same seeded inputs
    as :func:`analyze`: ``{name: result}`` for every step run. ``qkov serve`` uses it to answer with
    exactly the numbers ``analyze`` writes. With ``weights_only`` no token batch is drawn and the
    steps of ``EITHER`` inputs read the weights alone."""
    unknown = sorted(set(names) - set(STEP_NAMES))
    if unknown:
        raise QkovError(f"no analysis step {', '.join(unknown)}")
    wanted = _with_reads(names)
    steps = [s for s in STEPS if s.name in wanted]
    whole = [s.name for s in steps if not s.narrow_ends]
    if whole and holds_narrow(model):
        raise QkovError(f"steps {', '.join(whole)}: {NARROW_REASON}")
    model = model.eval()
    done: dict[str, Any] = {}
    ctx = Context.of(model, corpus_tokens, seed, MappingProxyType(done), user_tokens, weights_only)
    with _progress(show_progress) as progress, torch.no_grad():
        task = progress.add_task("analysing", total=sum(s.weight for s in steps))
        for step in steps:
            progress.update(task, description=f"analysing: {step.title}")
            done[step.name] = step.run(ctx)
            progress.advance(task, step.weight)
    return done


def analyze_model(
    model: AttnOnlyTransformer | str | os.PathLike,
    corpus_tokens: CorpusSplits | None = None,
    training_log: list[TrainingPoint] | None = None,
    show_progress: bool = True,
    seed: int = 0,
    user_tokens: UserTokens | None = None,
    steps: Sequence[str] | None = None,
    weights_only: bool = False,
) -> Results:
    """``qkov.analyze(model)``: :func:`analyze` on a model, or on a checkpoint folder as ``qkov
    analyze folder`` reads it (any folder :func:`qkov.open_model` opens, its weights checked, its
    ``metrics.jsonl`` as the training log unless ``training_log`` is given), so that the
    :class:`~qkov.results.Results` are those the command writes to ``results.json``; ``steps`` and
    ``weights_only`` choose the steps as ``--steps`` and ``--weights-only`` do."""
    if isinstance(model, (str, os.PathLike)):
        folder = Path(model)
        model = open_model(folder)
        check_weight_magnitudes(dict(model.named_parameters()), str(folder))
        training_log = read_training_log(folder) if training_log is None else training_log
    return analyze(model, corpus_tokens, training_log, show_progress, seed, user_tokens, steps, weights_only)


class _CallableModule(ModuleType):
    """This module, which ``qkov.analyze(...)`` calls as :func:`analyze_model`."""

    def __call__(self, *args: Any, **kwargs: Any) -> Results:
        return analyze_model(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
