"""The typed results of every analysis: what ``results.json`` holds, and what the report and the
command line read.

Every result is a frozen standard-library dataclass of plain values (numbers, strings, lists, other
such dataclasses): the analyses in :mod:`qkov.circuits` return them without depending on a
serialization library, and a notebook user reads fields with a type checker's help. One serializer,
pydantic's ``TypeAdapter``, turns them into JSON, validates JSON back into them, and generates the
JSON Schema shipped beside this module (``schema/results.schema.json``). We chose dataclasses plus
one adapter over pydantic models so that the circuits modules stay free of the serialization library
and their own result types (``TermImportance``, ``SkipTrigram``, ``BigramComparison``) are the
results, not copies of them.

JSON has no NaN: a number that is undefined (a head whose OV circuit is zero has no copying score)
is ``None`` here and ``null`` in the file.

``Results`` is one checkpoint's analysis (``qkov analyze``); ``Reproduction`` is ``qkov reproduce``'s
(every model's ``Results`` and the paper's claims). :func:`load_results` reads either, and refuses a
file of another ``schema_version`` with one line.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from qkov.circuits.ablation import AblationEffect
from qkov.circuits.bigrams import BigramComparison
from qkov.circuits.copying import CopyingComparison, DirectCopying
from qkov.circuits.paths import TermImportance
from qkov.circuits.phase_change import PhaseChange
from qkov.circuits.skip_trigrams import Crossed, SkipTrigram, SkipTrigramBug
from qkov.circuits.spectra import HeadSpectrum
from qkov.config import Config
from qkov.errors import QkovError
from qkov.io import atomic_write_text
from qkov.training_log import TrainingPoint

SCHEMA_VERSION = 2  # 2: the phase change by Olsson et al.'s signatures (window in log tokens)
SCHEMA_FILE = Path(__file__).parent / "schema" / "results.schema.json"


def finite(x: float) -> float | None:
    """An undefined number (NaN, infinite) as ``None``, the JSON-safe form."""
    x = float(x)
    return x if math.isfinite(x) else None


# -- heads ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HeadCopying:
    """One head's full OV circuit ``W_E W_V W_O W_U``: its eigenvalue copying score
    ``Re(sum l) / sum |l|``, the direct measures, and the eigenvalues ``(re, im)``."""

    name: str
    layer: int
    head: int
    copying_score: float | None
    self_top1: float | None
    diagonal_z: float | None
    eigenvalues: list[tuple[float, float]]
    copies: bool  # the copying score is above the random baseline's 99th percentile


@dataclass(frozen=True)
class Copying:
    """Copying (section "Copying / Primarily Positive Eigenvalues"): every head, and the scores of
    random factors of the same shapes (``baseline``); a head copies above ``threshold``, the
    baseline's 99th percentile."""

    heads: list[HeadCopying]
    baseline: list[float]
    baseline_mean: float
    threshold: float
    copying_heads: int


@dataclass(frozen=True)
class Spectra:
    """Every head's full OV circuit ``W_E W_V W_O W_U`` and full QK circuit
    ``W_E W_Q W_K^T W_E^T / sqrt(d_head)`` (token to token) summarised over the whole vocabulary:
    norm, top singular values, effective rank and (OV) eigenvalue copying score."""

    OV: list[HeadSpectrum]
    QK: list[HeadSpectrum]


@dataclass(frozen=True)
class HeadBehaviour:
    """One head's attention on repeated random tokens: mean attention one back (previous-token),
    to the token after the previous occurrence (induction) and to the previous occurrence itself
    (duplicate-token)."""

    name: str
    layer: int
    head: int
    previous_token_score: float | None
    induction_score: float | None
    duplicate_token_score: float | None


@dataclass(frozen=True)
class RepeatedTokens:
    """Behaviour on ``sequences`` random sequences of ``period`` tokens repeated ``repeats`` times:
    the mean next-token loss on each repeat (see :func:`qkov.circuits.ablation.repeat_behaviour`) and
    every head's scores. ``previous_token_heads`` and ``induction_heads`` are the heads whose score
    passes ``previous_token_threshold`` and ``induction_threshold``."""

    period: int
    repeats: int
    sequences: int
    loss_per_repeat: list[float]
    heads: list[HeadBehaviour]
    previous_token_threshold: float
    induction_threshold: float
    previous_token_heads: list[str]
    induction_heads: list[str]


@dataclass(frozen=True)
class AttentionExample:
    """Every head's attention pattern on one sequence: ``patterns[head][dest][src]`` for
    ``src <= dest``; ``description`` says what the sequence is."""

    description: str
    tokens: list[int]
    patterns: dict[str, list[list[float]]]


@dataclass(frozen=True)
class AttentionExamples:
    repeated: AttentionExample
    corpus: AttentionExample | None


@dataclass(frozen=True, kw_only=True)
class TermImportanceResult(TermImportance):
    """Term importance (section "Path Expansion of Logits") and the tokens it was measured on."""

    tokens: str


@dataclass(frozen=True, kw_only=True)
class SkipTrigramRow(SkipTrigram):
    """A skip-trigram ``source … destination → out`` with its tokens' strings."""

    source_str: str
    destination_str: str
    out_str: str


@dataclass(frozen=True, kw_only=True)
class CrossedRow(Crossed):
    destination_str: str
    out_str: str


@dataclass(frozen=True, kw_only=True)
class SkipTrigramBugRow(SkipTrigramBug):
    """A skip-trigram bug (see :class:`~qkov.circuits.skip_trigrams.SkipTrigramBug`) with strings."""

    crossed: list[CrossedRow]
    source_str: str
    first_str: tuple[str, str]
    second_str: tuple[str, str]


@dataclass(frozen=True)
class SkipTrigrams:
    """Every first-layer head's strongest skip-trigrams and the bugs they force, by head name."""

    tables: dict[str, list[SkipTrigramRow]]
    bugs: dict[str, list[SkipTrigramBugRow]]


@dataclass(frozen=True)
class CompositionPair:
    """How much an earlier head (``writer``) composes into a later one (``reader``): the raw score
    (as TransformerLens reports it), the random baseline, and ``score = raw - baseline``."""

    writer: str
    reader: str
    raw: float
    baseline: float
    score: float


@dataclass(frozen=True)
class Composition:
    """Q-, K- and V-composition of every earlier head into every later one (section "Two-Layer
    Attention-Only Transformers"), against ``baseline``, the expected score of random heads."""

    baseline: float
    Q: list[CompositionPair]
    K: list[CompositionPair]
    V: list[CompositionPair]


@dataclass(frozen=True)
class InductionCheck:
    """A later head: its OV copying score and the eigenvalue positivity of its token-level
    K-composition term with the earlier head that gives the strongest (``writer``); ``all`` holds
    the positivity with every earlier head."""

    head: str
    ov_copying: float | None
    k_composition_positivity: float
    writer: str
    all: dict[str, float]


# -- one checkpoint, and the reproduction ---------------------------------------------------------
@dataclass(frozen=True)
class Results:
    """Every analysis of one checkpoint (``results.json`` of ``qkov analyze``). An analysis that
    does not apply to the model (composition needs two layers, the bigram comparison a corpus) is
    ``None``."""

    config: Config
    tokens: list[str]
    training: list[TrainingPoint]
    phase_change: PhaseChange | None
    schema_version: int = SCHEMA_VERSION
    bigram: BigramComparison | None = None
    spectra: Spectra | None = None
    copying_direct: list[DirectCopying] | None = None
    copying: Copying | None = None
    copying_comparison: list[CopyingComparison] | None = None
    repeated_tokens: RepeatedTokens | None = None
    attention_examples: AttentionExamples | None = None
    qk_position_content: dict[str, dict[str, float]] | None = None
    term_importance: TermImportanceResult | None = None
    skip_trigrams: SkipTrigrams | None = None
    composition: Composition | None = None
    induction_check: list[InductionCheck] | None = None
    ablation: list[AblationEffect] | None = None


@dataclass(frozen=True)
class Claim:
    """One of the paper's claims, the measurement here, the rule that decides it, and its verdict."""

    claim: str
    paper: str
    measured: str
    rule: str
    holds: bool


@dataclass(frozen=True)
class ModelTiming:
    train_s: float
    analyze_s: float


@dataclass(frozen=True)
class Reproduction:
    """``qkov reproduce``: every model's results, the paper's claims, and what the run took."""

    models: dict[str, Results]
    claims: list[Claim]
    timings: dict[str, ModelTiming]
    total_s: float
    quick: bool
    device: str
    corpus: str | list[str]
    schema_version: int = SCHEMA_VERSION


# -- serialization --------------------------------------------------------------------------------
ANY_RESULTS: TypeAdapter[Results | Reproduction] = TypeAdapter(Results | Reproduction)


def to_json(results: Results | Reproduction) -> str:
    return ANY_RESULTS.dump_json(results, indent=1).decode() + "\n"


def write_results(results: Results | Reproduction, folder: Path) -> Path:
    """``folder/results.json``, written atomically."""
    file = folder / "results.json"
    atomic_write_text(file, to_json(results))
    return file


def _validation_message(err: ValidationError) -> str:
    first = err.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "top level"
    return f"{where}: {first['msg']} ({err.error_count()} problem(s) in all)"


def load_results(path: str | Path) -> Results | Reproduction:
    """Read a ``results.json`` (of ``qkov analyze`` or ``qkov reproduce``) into its typed form.

    Raises :class:`QkovError` with one line for a missing or unreadable file, a ``schema_version``
    this qkov does not read, or a field of the wrong type."""
    file = Path(path)
    try:
        data: Any = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise QkovError(f"{file}: cannot read results ({err})") from None
    version = data.get("schema_version") if isinstance(data, dict) else None
    if version != SCHEMA_VERSION:
        raise QkovError(
            f"{file}: schema_version {version!r}, but this qkov reads version {SCHEMA_VERSION} "
            "(rerun qkov analyze or qkov reproduce to write it again)"
        )
    adapter = TypeAdapter(Reproduction if "models" in data else Results)
    try:
        return adapter.validate_python(data)
    except ValidationError as err:
        raise QkovError(f"{file}: {_validation_message(err)}") from None


def json_schema() -> dict[str, Any]:
    """The JSON Schema of ``results.json``, generated from these types (either kind of file)."""
    schema = ANY_RESULTS.json_schema(mode="serialization")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"qkov results.json, schema_version {SCHEMA_VERSION}",
    } | schema


def schema_text() -> str:
    return json.dumps(json_schema(), indent=1, sort_keys=True) + "\n"
