"""Every analysis that applies to a model's depth, collected into one JSON-ready tree (the
paper's sections "Zero-Layer", "One-Layer" and "Two-Layer Attention-Only Transformers").

:func:`analyze` is what ``qkov analyze`` runs; ``results.json`` is its return value, documented in
the README. The report renders it and computes nothing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from tokenizers import Tokenizer

from qkov.checkpoint import load
from qkov.circuits.ablation import ablation_effects, repeat_behaviour
from qkov.circuits.bigrams import BigramCounts, compare_bigrams
from qkov.circuits.composition import (
    KINDS,
    all_raw_composition_scores,
    composition_baseline,
    k_composition_positivity,
)
from qkov.circuits.copying import copying_analysis
from qkov.circuits.heads import duplicate_token_scores, previous_token_scores
from qkov.circuits.paths import term_importance
from qkov.circuits.qk_ov import qk_term_rms, qk_terms
from qkov.circuits.skip_trigrams import (
    head_circuits,
    skip_trigram_bugs,
    skip_trigram_occurs,
    strongest_skip_trigrams,
)
from qkov.data.corpus import read_corpus
from qkov.data.random_tokens import repeated_random_tokens
from qkov.data.tokens import cached_tokens, sample_windows
from qkov.errors import QkovError
from qkov.io import atomic_write_text
from qkov.model import AttnOnlyTransformer
from qkov.names import head_name
from qkov.report import render_report
from qkov.train import METRICS_FILE

REPEATS = 3
REPEAT_BATCH = 32
SKIP_TRIGRAMS_PER_HEAD = 50
MIN_TOKEN_COUNT = 20  # with a corpus, skip-trigrams use only tokens seen this often (rare rows are noise)
PATTERN_EXAMPLE_LENGTH = 48  # tokens in the attention-pattern examples kept for the report (3 x 16)


def _finite(x: float) -> float | None:
    """JSON has no NaN: undefined numbers are null."""
    x = float(x)
    return None if math.isnan(x) or math.isinf(x) else x


def token_strings(tokenizer: Tokenizer | None, d_vocab: int) -> list[str]:
    """How each token reads: its decoded text, or ``#id`` without a tokenizer."""
    if tokenizer is None:
        return [f"#{i}" for i in range(d_vocab)]
    return [tokenizer.decode([i]) for i in range(d_vocab)]


class Steps:
    """A progress display with one line per analysis step (quiet when ``show`` is false)."""

    def __init__(self, show: bool, total: int) -> None:
        columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"))
        self.progress = Progress(
            *columns, TimeElapsedColumn(), console=Console(stderr=True), disable=not show
        )
        self.task = self.progress.add_task("analysing", total=total)

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        self.progress.update(self.task, description=f"analysing: {name}")
        yield
        self.progress.advance(self.task)


def analyze(
    model: AttnOnlyTransformer,
    corpus_tokens: tuple[np.ndarray, np.ndarray] | None = None,
    training_log: list[dict] | None = None,
    show_progress: bool = True,
    seed: int = 0,
) -> dict:
    """Run every analysis for the model's depth. ``corpus_tokens`` (train and eval arrays, in the
    model's tokenizer) adds the bigram comparison, marks skip-trigram bugs that never occur, and
    gives the text for term importance; without it term importance uses repeated random tokens."""
    cfg = model.cfg
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    strings = token_strings(model.tokenizer, cfg.d_vocab)
    n_steps = (
        1
        + (corpus_tokens is not None)
        + (cfg.n_layers >= 1) * 4
        + (cfg.n_layers == 1)
        + (cfg.n_layers >= 2) * 3
    )
    steps = Steps(show_progress, n_steps)
    results: dict = {
        "config": cfg.to_dict(),
        "tokens": strings,
        "training": training_log or [],
        "phase_change": phase_change(training_log or []),
    }
    with steps.progress, torch.no_grad():
        with steps.step("heads"):
            results["heads"] = [
                {"name": head_name(layer, head), "layer": layer, "head": head}
                for layer in range(cfg.n_layers)
                for head in range(cfg.n_heads)
            ]
        allowed = None  # with a corpus, skip-trigrams use only tokens seen often enough to be trained
        if corpus_tokens is not None:
            with steps.step("bigram statistics"):
                counts = BigramCounts.of(corpus_tokens[0], cfg.d_vocab)
                results["bigram"] = compare_bigrams(model, counts).__dict__
                allowed = torch.from_numpy(counts.unigram >= MIN_TOKEN_COUNT)
        if cfg.n_layers >= 1:
            with steps.step("copying (OV eigenvalues)"):
                results["copying"] = _copying(model, results["heads"])
            with steps.step("repeated random tokens"):
                period = cfg.n_ctx // REPEATS
                repeated = repeated_random_tokens(REPEAT_BATCH, period, REPEATS, cfg.d_vocab, generator)
                results["in_context_loss"] = _behaviour(model, repeated, period, results["heads"])
                example_period = min(PATTERN_EXAMPLE_LENGTH, cfg.n_ctx) // REPEATS
                example = repeated_random_tokens(1, example_period, REPEATS, cfg.d_vocab, generator)
                results["attention_examples"] = {"repeated": _patterns(model, example[0])}
                if corpus_tokens is not None:
                    snippet = sample_windows(
                        corpus_tokens[1], 1, min(PATTERN_EXAMPLE_LENGTH, cfg.n_ctx), generator
                    )
                    results["attention_examples"]["corpus"] = _patterns(model, snippet[0])
            with steps.step("position versus content"):
                results["qk_position_content"] = _position_content(model) if model.W_pos is not None else None
            with steps.step("term importance"):
                if corpus_tokens is not None:
                    text = sample_windows(corpus_tokens[1], REPEAT_BATCH, cfg.n_ctx, generator)
                else:
                    text = repeated
                importance = term_importance(model, text)
                results["term_importance"] = importance.__dict__ | {
                    "tokens": "corpus (eval split)" if corpus_tokens is not None else "repeated random tokens"
                }
        if cfg.n_layers == 1:
            with steps.step("skip-trigrams"):
                results["skip_trigrams"], results["skip_trigram_bugs"] = _skip_trigrams(
                    model, corpus_tokens, strings, allowed
                )
        if cfg.n_layers >= 2:
            with steps.step("composition scores"):
                results["composition"] = _composition(model)
            with steps.step("induction mechanism (K-composition)"):
                results["induction_check"] = _induction_check(model, results["heads"])
            with steps.step("ablations"):
                results["ablation"] = ablation_effects(model, repeated, period)
    return results


def phase_change(training_log: list[dict]) -> dict | None:
    """When the induction heads formed during training, from the best induction score at each
    eval: ``onset_tokens`` where it first passed 10% of its final value, ``complete_tokens`` where
    it first passed 90%, their distance as a fraction of the whole run (``width_fraction``: the
    paper's phase change is abrupt, a small fraction), and the interval of the steepest rise. None
    without such a log or without a rise."""
    rows = [row for row in training_log if row.get("induction_score") is not None]
    if len(rows) < 2:
        return None
    start, final = rows[0]["induction_score"], rows[-1]["induction_score"]
    if final <= start:
        return None

    def first_past(fraction: float) -> float:
        level = start + fraction * (final - start)
        return next(row["tokens"] for row in rows if row["induction_score"] >= level)

    steepest = max(
        zip(rows, rows[1:], strict=False), key=lambda p: p[1]["induction_score"] - p[0]["induction_score"]
    )
    onset, complete = first_past(0.1), first_past(0.9)
    return {
        "onset_tokens": onset,
        "complete_tokens": complete,
        "width_fraction": (complete - onset) / rows[-1]["tokens"],
        "steepest_tokens": (steepest[0]["tokens"] + steepest[1]["tokens"]) / 2,
        "initial_induction": start,
        "final_induction": final,
    }


def _copying(model: AttnOnlyTransformer, heads: list[dict]) -> dict:
    copying = copying_analysis(model)
    for head in heads:
        index = head["layer"], head["head"]
        head["copying_score"] = _finite(copying.scores[index])
        head["self_top1"] = _finite(copying.self_top1[index])
        head["diagonal_z"] = _finite(copying.diagonal_z[index])
    return {
        "baseline_mean": float(copying.baseline.mean()),
        "threshold": copying.threshold,
        "baseline": [round(float(x), 4) for x in copying.baseline],
        "copying_heads": copying.copying_heads,
        "eigenvalues": {
            head["name"]: [
                [round(float(e.real), 5), round(float(e.imag), 5)]
                for e in copying.eigenvalues[head["layer"], head["head"]]
            ]
            for head in heads
        },
    }


def _behaviour(model: AttnOnlyTransformer, repeated: torch.Tensor, period: int, heads: list[dict]) -> dict:
    logits, cache = model.run_with_cache(repeated)
    behaviour = repeat_behaviour(logits, cache, repeated, period)
    previous = previous_token_scores(cache)
    duplicate = duplicate_token_scores(cache, period)
    for head in heads:
        index = head["layer"], head["head"]
        head["previous_token_score"] = _finite(previous[index])
        head["induction_score"] = _finite(behaviour.induction[index[0]][index[1]])
        head["duplicate_token_score"] = _finite(duplicate[index])
    return {"repeats": behaviour.loss_per_repeat, "period": period, "sequences": repeated.shape[0]}


def _patterns(model: AttnOnlyTransformer, tokens: torch.Tensor) -> dict:
    _, cache = model.run_with_cache(tokens[None])
    patterns = {}
    for layer in range(model.cfg.n_layers):
        for head, pattern in enumerate(cache[f"blocks.{layer}.attn.hook_pattern"][0]):
            patterns[head_name(layer, head)] = [
                [round(float(x), 3) for x in row[: i + 1]] for i, row in enumerate(pattern)
            ]
    return {"tokens": tokens.tolist(), "patterns": patterns}


def _position_content(model: AttnOnlyTransformer) -> dict:
    rms = qk_term_rms(qk_terms(model))
    return {
        name: {head_name(layer, head): float(v) for (layer, head), v in np.ndenumerate(values.numpy())}
        for name, values in rms.items()
    }


def _skip_trigrams(
    model: AttnOnlyTransformer, corpus_tokens, strings: list[str], allowed: torch.Tensor | None
) -> tuple[dict, dict]:
    tables, bugs = {}, {}
    for head in range(model.cfg.n_heads):
        circuits = head_circuits(model, 0, head, allowed)
        trigrams = strongest_skip_trigrams(circuits, SKIP_TRIGRAMS_PER_HEAD)
        name = head_name(0, head)
        tables[name] = [
            t.to_dict()
            | {f"{part}_str": strings[getattr(t, part)] for part in ("source", "destination", "out")}
            for t in trigrams
        ]
        head_bugs = [bug.to_dict() for bug in skip_trigram_bugs(circuits, trigrams)]
        for bug in head_bugs:
            bug["source_str"] = strings[bug["source"]]
            for pair in ("first", "second"):
                bug[f"{pair}_str"] = [strings[t] for t in bug[pair]]
            for crossed in bug["crossed"]:
                crossed["destination_str"], crossed["out_str"] = (
                    strings[crossed["destination"]],
                    strings[crossed["out"]],
                )
                if corpus_tokens is not None:
                    crossed["in_corpus"] = skip_trigram_occurs(
                        corpus_tokens[0],
                        bug["source"],
                        crossed["destination"],
                        crossed["out"],
                        model.cfg.n_ctx,
                    )
        bugs[name] = head_bugs
    return tables, bugs


def _composition(model: AttnOnlyTransformer) -> dict:
    baseline = composition_baseline(model.cfg.d_model, model.cfg.d_head)
    out = {}
    for kind, raw in all_raw_composition_scores(model, KINDS).items():
        out[kind] = [
            {
                "from": head_name(l1, h1),
                "to": head_name(l2, h2),
                "raw": float(value),
                "baseline": baseline,
                "score": float(value) - baseline,
            }
            for (l1, h1, l2, h2), value in np.ndenumerate(raw.numpy())
            if not math.isnan(value)
        ]
    return out


def _induction_check(model: AttnOnlyTransformer, heads: list[dict]) -> list[dict]:
    positivity = k_composition_positivity(model)
    copying = {head["name"]: head["copying_score"] for head in heads}
    rows = []
    for layer in range(1, model.cfg.n_layers):
        for head in range(model.cfg.n_heads):
            per_writer = positivity[:layer, :, layer, head]  # [earlier layers, n_heads]
            best = int(per_writer.flatten().argmax())
            writer = head_name(*divmod(best, model.cfg.n_heads))
            rows.append(
                {
                    "head": head_name(layer, head),
                    "ov_copying": copying[head_name(layer, head)],
                    "k_composition_positivity": float(per_writer.flatten()[best]),
                    "with": writer,
                    "all": {
                        head_name(l1, h1): float(per_writer[l1, h1])
                        for l1 in range(layer)
                        for h1 in range(model.cfg.n_heads)
                    },
                }
            )
    return rows


def write_results(results: dict, out: Path) -> None:
    atomic_write_text(out / "results.json", json.dumps(results, indent=1, allow_nan=False) + "\n")


def corpus_token_arrays(
    patterns: list[str] | None, tokenizer: Tokenizer | None
) -> tuple[np.ndarray, np.ndarray]:
    """The train and eval token arrays of a corpus (``["stdlib"]``: the embedded default), in the
    checkpoint's tokenizer (cached like training's)."""
    if tokenizer is None:
        raise QkovError("--corpus needs a checkpoint with a tokenizer.json to read text")
    corpus = read_corpus(None if patterns == ["stdlib"] else patterns)
    splits = cached_tokens(corpus, tokenizer)
    return splits.train, splits.eval


def read_training_log(folder: Path) -> list[dict]:
    """The rows of ``metrics.jsonl`` when the folder has one (training curves for the report)."""
    file = folder / METRICS_FILE
    if not file.is_file():
        return []
    try:
        return [json.loads(line) for line in file.read_text().splitlines() if line.strip()]
    except json.JSONDecodeError as err:
        raise QkovError(f"{file}: not valid JSON lines ({err})") from None


def analyze_checkpoint(
    checkpoint: str | Path,
    out: Path,
    corpus: list[str] | None = None,
    seed: int = 0,
    show_progress: bool = True,
) -> dict:
    """``qkov analyze``: load, analyse, write ``out/results.json`` and ``out/report.html``."""
    model = load(checkpoint)
    corpus_tokens = corpus_token_arrays(corpus, model.tokenizer) if corpus else None
    results = analyze(model, corpus_tokens, read_training_log(Path(checkpoint)), show_progress, seed)
    out.mkdir(parents=True, exist_ok=True)
    write_results(results, out)
    atomic_write_text(out / "report.html", render_report({f"{model.cfg.n_layers}-layer": results}))
    return results
