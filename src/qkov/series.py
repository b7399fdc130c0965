"""A checkpoint series: the induction phase change of a run read from its checkpoints alone, without
its training log ("In-context Learning and Induction Heads", Olsson et al. 2022, the follow-up to
the framework paper's "Two-Layer Attention-Only Transformers").

A series is a folder whose checkpoints are labelled by a number at the end of their names, by
training step or by tokens seen: weights files (``model_20000.pth``, ``.pt``, ``.bin``,
``.safetensors``; read with the ``config.json`` beside them or a given one, as TransformerLens
weights, or through a key mapping) or qkov checkpoint folders (``checkpoint-500/``, ``step-500/``).
Each checkpoint is measured by :func:`qkov.evaluation.evaluate`, the function behind every row of
the trainer's ``metrics.jsonl``, on inputs drawn once for the series, and the rows are judged by
the same rule (:func:`qkov.circuits.phase_change.phase_change`; the loss bump read off the held-out
loss, since a checkpoint has no training loss). A 1-layer series given as the control decides the
verdict; without one it is undecided, as for a single checkpoint.

The held-out text is a corpus' held-out split through the checkpoints' tokenizer, as in training,
or, without one, random tokens that repeat (:func:`qkov.evaluation.repeating_text`): the
in-context-learning score then measures the in-context learning induction heads bring on such
tokens, not on language. Of a qkov run folder, ``train_config.json`` gives the tokens of a step and
the seed and number of the held-out tokens the trainer drew, so the series measures the very
numbers its ``metrics.jsonl`` holds (train loss aside).

Rows are written to ``series.jsonl`` (and the control's to ``control.jsonl``), rewritten atomically
after each checkpoint: an interrupted series continues where it stopped, when rerun with the same
settings (``series.json``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from tokenizers import Tokenizer

from qkov.analyze import token_strings
from qkov.checkpoint import CONFIG_FILE, WEIGHTS_FILE, load
from qkov.circuits.phase_change import PhaseChange, describe, phase_change
from qkov.config import Config
from qkov.data.shards import corpus_tokens
from qkov.data.sources import TEXT_FIELD
from qkov.errors import QkovError
from qkov.evaluation import EvaluationInputs, evaluate, evaluation_inputs
from qkov.interop.mapping import from_weights
from qkov.interop.source import WEIGHT_SUFFIXES
from qkov.interop.transformer_lens import from_transformer_lens
from qkov.io import atomic_write_text, read_json, remove_stale_temporaries
from qkov.machine import compute_device
from qkov.model import Transformer
from qkov.results import Results
from qkov.schedule import EVAL_TOKENS
from qkov.train import TRAIN_CONFIG_FILE
from qkov.training_log import TrainingPoint, read_points, write_points

SERIES_FILE, CONTROL_FILE, SETTINGS_FILE = "series.jsonl", "control.jsonl", "series.json"
LABELS = ("steps", "tokens")
# The loss bump is the loss slope's dip, and loss_slope needs four evaluations for one 3-point mean
# of slopes; with fewer, the window would be the interpolation between two checkpoints, not a
# measurement, so no verdict is given.
MIN_CHECKPOINTS = 4
_NUMBER = re.compile(r"(\d+)$")


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint of a series: the number its name ends in, and its file or folder."""

    number: int
    path: Path


def _is_candidate(path: Path) -> bool:
    if path.is_dir():
        return (path / CONFIG_FILE).is_file() and (path / WEIGHTS_FILE).is_file()
    return path.is_file() and path.suffix in WEIGHT_SUFFIXES


def find_checkpoints(folder: Path) -> list[Checkpoint]:
    """The checkpoints of ``folder`` (see the module docstring) by their number; one line when
    there are none, when weights files and checkpoint folders are mixed, or a name holds no
    number or the same number as another."""
    if not folder.is_dir():
        raise QkovError(f"{folder}: no such folder of checkpoints")
    if _is_candidate(folder):
        raise QkovError(
            f"{folder}: one checkpoint, not a folder of them (qkov analyze reads its phase change off "
            "its metrics.jsonl)"
        )
    found = sorted(p for p in folder.iterdir() if _is_candidate(p))
    if not found:
        raise QkovError(
            f"{folder}: no checkpoints (weights files {', '.join(WEIGHT_SUFFIXES)}, or qkov checkpoint "
            "folders, named with their step or tokens at the end: model_20000.pth, checkpoint-500)"
        )
    if len({p.is_dir() for p in found}) > 1:
        raise QkovError(f"{folder}: holds both weights files and checkpoint folders; keep one kind")
    checkpoints = []
    for path in found:
        number = _NUMBER.search(path.stem if path.is_file() else path.name)
        if number is None:
            raise QkovError(f"{path}: no step or tokens at the end of its name (e.g. {path.stem}_1000)")
        checkpoints.append(Checkpoint(int(number.group(1)), path))
    numbers = [c.number for c in checkpoints]
    if len(set(numbers)) < len(numbers):
        twice = next(n for n in numbers if numbers.count(n) > 1)
        raise QkovError(f"{folder}: two checkpoints are labelled {twice}")
    return sorted(checkpoints, key=lambda c: c.number)


@dataclass(frozen=True)
class SeriesSource:
    """A folder of checkpoints and how its weights files are read: with ``config`` (default: the
    ``config.json`` beside them, a TransformerLens config) or through ``mapping``."""

    folder: Path
    config: Path | None = None
    mapping: Path | None = None

    def __post_init__(self) -> None:
        if self.config is not None and self.mapping is not None:
            raise QkovError("give a config or a mapping, not both (a mapping holds the model's config)")

    def load(self, checkpoint: Checkpoint) -> Transformer:
        """The checkpoint's model, folded as ``qkov import`` folds it."""
        if checkpoint.path.is_dir():
            return load(checkpoint.path)
        if self.mapping is not None:
            return from_weights(checkpoint.path, self.mapping)
        return from_transformer_lens(checkpoint.path, config=self.config or self.folder / CONFIG_FILE)


def run_settings(folder: Path) -> dict[str, Any]:
    """Of a qkov run folder's ``train_config.json``: its batch size, seed and held-out tokens."""
    file = folder / TRAIN_CONFIG_FILE
    if not file.is_file():
        return {}
    saved = read_json(file)
    if not isinstance(saved, dict):
        raise QkovError(f"{file}: expected a JSON object")
    return {k: saved[k] for k in ("batch_size", "seed", "eval_tokens") if k in saved}


@dataclass(frozen=True)
class Labels:
    """What the checkpoints' numbers count (``by``: steps or tokens) and the tokens of one step:
    ``tokens_per_step``, else ``batch_size`` x the context (a qkov run's), else unknown."""

    by: str
    tokens_per_step: int | None = None
    batch_size: int | None = None

    def __post_init__(self) -> None:
        if self.by not in LABELS:
            raise QkovError(f"--label must be one of {', '.join(LABELS)}, got {self.by!r}")
        if self.tokens_per_step is not None and self.tokens_per_step < 1:
            raise QkovError(f"--tokens-per-step must be at least 1, got {self.tokens_per_step}")

    def place(self, number: int, index: int, n_ctx: int, where: Path) -> tuple[int, int]:
        """``(step, tokens)`` of the checkpoint labelled ``number``, ``index``-th of its series. Its
        step is its position in the series when labelled by tokens with no known step size."""
        per_step = self.tokens_per_step or (self.batch_size * n_ctx if self.batch_size else None)
        if self.by == "tokens":
            return (number // per_step if per_step else index), number
        if per_step is None:
            raise QkovError(
                f"{where}: checkpoints labelled by steps need --tokens-per-step N (the tokens of one "
                "training step: batch size x context) to place them on the tokens axis, or --label tokens"
            )
        return number, number * per_step


@dataclass(frozen=True)
class Series:
    """A source, its checkpoints and where each one lies, checked to be one model: one config and
    one tokenizer throughout; ``cfg`` and ``tokenizer`` are theirs."""

    source: SeriesSource
    labels: Labels
    checkpoints: list[Checkpoint]
    places: list[tuple[int, int]]
    cfg: Config
    tokenizer: Tokenizer | None

    def settings(self) -> dict[str, Any]:
        """What a continued series must agree with: the source, its files' paths and the labels."""
        named = {k: None if v is None else str(Path(v).resolve()) for k, v in asdict(self.source).items()}
        return named | asdict(self.labels)


def open_series(source: SeriesSource, labels: Labels, show: Callable[[str], None]) -> Series:
    """Find, place and load every checkpoint once (so that a mixed series is refused before anything
    is written); one line for the first that differs from the first checkpoint."""
    checkpoints = find_checkpoints(source.folder)
    show(f"{source.folder}: {len(checkpoints)} checkpoints; checking that they are one model")
    first = source.load(checkpoints[0])
    n_ctx = first.cfg.n_ctx
    places = [labels.place(c.number, i, n_ctx, source.folder) for i, c in enumerate(checkpoints)]
    tokenizer = first.tokenizer.to_str() if first.tokenizer is not None else None
    for checkpoint in checkpoints[1:]:
        model = source.load(checkpoint)
        if model.cfg != first.cfg:
            raise QkovError(
                f"{checkpoint.path}: another model than {checkpoints[0].path.name} (mixed shapes or "
                f"settings: {_difference(first.cfg, model.cfg)})"
            )
        if (model.tokenizer.to_str() if model.tokenizer is not None else None) != tokenizer:
            raise QkovError(f"{checkpoint.path}: another tokenizer than {checkpoints[0].path.name}'s")
    return Series(source, labels, checkpoints, places, first.cfg, first.tokenizer)


def _difference(a: Config, b: Config) -> str:
    ours, theirs = a.to_dict(), b.to_dict()
    return ", ".join(f"{k} {ours[k]} vs {theirs[k]}" for k in ours if ours[k] != theirs.get(k))


# -- measuring -------------------------------------------------------------------------------------
def measure(
    series: Series, inputs: EvaluationInputs, file: Path, device: torch.device, advance: Callable[[], None]
) -> list[TrainingPoint]:
    """A row for every checkpoint, by :func:`qkov.evaluation.evaluate`; rows ``file`` holds for the
    same place (step and tokens) are kept as they are, and ``file`` is rewritten after each new row."""
    rows = {(r.step, r.tokens): r for r in read_points(file) if (r.step, r.tokens) in series.places}
    inputs = inputs.to(device)
    for checkpoint, place in zip(series.checkpoints, series.places, strict=True):
        if place not in rows:
            model = series.source.load(checkpoint).to(device).eval()
            rows[place] = TrainingPoint(*place, **evaluate(model, inputs))
            write_points(file, sorted(rows.values(), key=lambda r: (r.tokens, r.step)))
        advance()
    return [rows[place] for place in series.places]


def judged(rows: list[TrainingPoint], control: list[TrainingPoint] | None) -> PhaseChange | None:
    """The phase change of a series by the rule, or None with under ``MIN_CHECKPOINTS`` checkpoints
    past zero tokens (no window can be measured) or no rise in the induction score."""
    if len({r.tokens for r in rows if r.tokens > 0}) < MIN_CHECKPOINTS:
        return None
    return phase_change(rows, control)


def claim_folder(out: Path, settings: dict[str, Any]) -> None:
    """Make ``out`` this series' folder, or continue the series in it: refused when it holds
    another series (other settings) or anything that is not a series."""
    file = out / SETTINGS_FILE
    if file.is_file():
        saved = read_json(file)
        if saved != settings:
            saved = saved if isinstance(saved, dict) else {}
            key = next(k for k in [*settings, *saved] if saved.get(k) != settings.get(k))
            raise QkovError(
                f"{out}: holds a series of other settings ({key}: {saved.get(key)!r}, now "
                f"{settings.get(key)!r}); use another --out, or the same settings to continue it"
            )
        return
    if out.is_dir():
        remove_stale_temporaries(out)  # a series killed while writing its settings left only these
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise QkovError(f"{out}: exists and holds no checkpoint series; choose another --out")
    atomic_write_text(file, json.dumps(settings, indent=1) + "\n")


# -- the whole series ------------------------------------------------------------------------------
@dataclass(frozen=True)
class SeriesRun:
    """``qkov series``: the checkpoints of ``source`` (and of the 1-layer ``control``) labelled by
    ``label`` (steps or tokens; ``tokens_per_step`` places steps on the tokens axis, default: a qkov
    run's ``train_config.json``), measured on the held-out split of ``corpus`` (files, folders or
    globs, or ``["stdlib"]``; None: repeating random tokens) with ``eval_tokens`` held-out tokens
    drawn from ``seed`` (default: the run's, else 32768 and 0), on ``device``, into ``out``."""

    source: SeriesSource
    out: Path
    label: str = "steps"
    tokens_per_step: int | None = None
    control: SeriesSource | None = None
    corpus: list[str] | None = None
    text_field: str = TEXT_FIELD
    seed: int | None = None
    eval_tokens: int | None = None
    device: str = "cpu"

    def held_out(self) -> str:
        """The held-out text, in words."""
        if self.corpus is None:
            return "repeating random tokens (no corpus given)"
        return f"the held-out split of {', '.join(self.corpus)}"


@dataclass(frozen=True)
class SeriesResults:
    """The series and its rows, the control and its rows (None without one), the phase change
    judged on them (None: too few checkpoints, or no rise) and the held-out text, in words."""

    series: Series
    rows: list[TrainingPoint]
    control: Series | None
    control_rows: list[TrainingPoint] | None
    phase_change: PhaseChange | None
    held_out: str


def held_out_tokens(series: Series, run: SeriesRun, show_progress: bool) -> Any | None:
    """The held-out split of the run's corpus in the series' tokenizer, or None without a corpus."""
    if run.corpus is None:
        return None
    if series.tokenizer is None:
        raise QkovError(f"{series.source.folder}: --corpus needs checkpoints with a tokenizer.json")
    return corpus_tokens(run.corpus, series.tokenizer, run.text_field, show_progress).eval


def _opened(source: SeriesSource, run: SeriesRun, show: Callable[[str], None]) -> Series:
    labels = Labels(run.label, run.tokens_per_step, run_settings(source.folder).get("batch_size"))
    return open_series(source, labels, show)


def run_series(run: SeriesRun, show_progress: bool = True) -> SeriesResults:
    """Check every checkpoint, then measure each not measured yet, and judge the phase change (see
    the module docstring). Nothing is written before every checkpoint has been read."""
    show = Console(stderr=True).print if show_progress else (lambda *a: None)
    device = compute_device(run.device)
    main = _opened(run.source, run, show)
    control = _opened(run.control, run, show) if run.control is not None else None
    if control is not None and control.cfg.n_layers != 1:
        raise QkovError(
            f"{control.source.folder}: the control must be a 1-layer series, not {control.cfg.n_layers}"
        )
    saved = run_settings(run.source.folder)
    seed = run.seed if run.seed is not None else saved.get("seed", 0)
    n_tokens = run.eval_tokens if run.eval_tokens is not None else saved.get("eval_tokens", EVAL_TOKENS)
    opened = [main] + ([control] if control is not None else [])
    inputs = [
        evaluation_inputs(s.cfg, held_out_tokens(s, run, show_progress), n_tokens, seed) for s in opened
    ]
    settings = {
        "held_out": run.held_out(),
        "text_field": run.text_field,
        "seed": seed,
        "eval_tokens": n_tokens,
    }
    settings |= {"series": main.settings(), "control": None if control is None else control.settings()}
    claim_folder(run.out, settings)
    rows = _measure_all(run.out, opened, inputs, device, show_progress)
    control_rows = rows[1] if control is not None else None
    change = judged(rows[0], control_rows)
    return SeriesResults(main, rows[0], control, control_rows, change, run.held_out())


def _measure_all(
    out: Path, opened: list[Series], inputs: list[EvaluationInputs], device: torch.device, show_progress: bool
) -> list[list[TrainingPoint]]:
    """The rows of each series (``series.jsonl``, then ``control.jsonl``), under one progress bar."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), disable=not show_progress) as progress:
        task = progress.add_task("measuring checkpoints", total=sum(len(s.checkpoints) for s in opened))
        files = (SERIES_FILE, CONTROL_FILE)[: len(opened)]
        return [
            measure(series, series_inputs, out / file, device, lambda: progress.advance(task))
            for series, series_inputs, file in zip(opened, inputs, files, strict=True)
        ]


# -- what a person reads ---------------------------------------------------------------------------
def series_results(r: SeriesResults) -> dict[str, Results]:
    """The report's models: the series, its rows as the training log and its phase change, and the
    control with its rows."""

    def results(series: Series, rows: list[TrainingPoint], change: PhaseChange | None) -> Results:
        strings = token_strings(series.tokenizer, series.cfg.d_vocab)
        return Results(config=series.cfg, tokens=strings, training=rows, phase_change=change)

    models = {f"{r.series.cfg.n_layers}-layer series": results(r.series, r.rows, r.phase_change)}
    if r.control is not None and r.control_rows is not None:
        models["1-layer control"] = results(r.control, r.control_rows, None)
    return models


def verdict_lines(r: SeriesResults) -> list[str]:
    """What the series shows, in a few lines: its extent, the window and the verdict, or why there
    is none."""
    first, last = r.rows[0], r.rows[-1]
    lines = [
        f"{len(r.rows)} checkpoints, {first.tokens:,} to {last.tokens:,} tokens; held-out text: {r.held_out}",
        f"best induction score {_score(first.induction_score)} -> {_score(last.induction_score)}, "
        f"in-context-learning score {_score(first.icl_score)} -> {_score(last.icl_score)}",
    ]
    change, past_zero = r.phase_change, len({row.tokens for row in r.rows if row.tokens > 0})
    if past_zero < MIN_CHECKPOINTS:
        return lines + [
            f"no verdict: {past_zero} checkpoint(s) past zero tokens cannot place a phase-change window (the "
            f"rule reads the induction score's rise between checkpoints, and the loss bump needs at least "
            f"{MIN_CHECKPOINTS}); give a denser series"
        ]
    if change is None:
        return lines + ["no phase change to judge: the best induction score does not rise over the series"]
    return lines + [describe(change), f"verdict: {change.verdict}"]


def _score(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
