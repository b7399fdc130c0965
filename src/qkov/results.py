"""The typed results of every analysis: what ``results.json`` holds, and what the report and the
command line read.

Every result is a frozen standard-library dataclass of plain values (numbers, strings, lists, other
such dataclasses), defined beside the analysis that computes it in :mod:`qkov.circuits` and returned
by it: those types are the results, not copies of them. A head is named ``L{layer}H{head}``; a token
is its id, and ``Results.tokens`` reads every id. One serializer, pydantic's ``TypeAdapter``, turns
the results into JSON, validates JSON back into them, and generates the JSON Schema shipped beside
this module (``schema/results.schema.json``). We chose dataclasses plus one adapter over pydantic
models so that the circuits modules stay free of the serialization library.

JSON has no NaN: a number that is undefined (a head whose OV circuit is zero has no copying score)
is ``None`` here and ``null`` in the file (:func:`qkov.numbers.finite`).

``Results`` is one checkpoint's analysis (``qkov analyze``); ``Reproduction`` is ``qkov reproduce``'s
(every model's ``Results`` and the paper's claims). :func:`load_results` reads either, and refuses a
file of another ``schema_version`` with one line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from qkov.circuits.ablation import AblationEffect
from qkov.circuits.attribution_patching import AblationEstimate
from qkov.circuits.bigrams import BigramComparison
from qkov.circuits.circuit import Circuit
from qkov.circuits.composition import Composition, InductionCheck
from qkov.circuits.copying import Copying, CopyingComparison, DirectCopying
from qkov.circuits.correction import Correction
from qkov.circuits.groups import GroupSimilarity
from qkov.circuits.heads import AttentionExamples
from qkov.circuits.mechanisms import InductionMechanism
from qkov.circuits.neurons import Neurons
from qkov.circuits.paths import TermImportance
from qkov.circuits.phase_change import PhaseChange
from qkov.circuits.repeated import RepeatedTokens
from qkov.circuits.rotary_bands import RotaryBands
from qkov.circuits.skip_trigrams import SkipTrigrams
from qkov.circuits.spectra import Spectra
from qkov.circuits.task import Task
from qkov.config import Config
from qkov.errors import QkovError
from qkov.io import atomic_write_text
from qkov.numbers import FAILS, HOLDS
from qkov.sidecar import SIDECAR_FIELDS, SidecarRef, join_arrays, sidecar_file, split_arrays, write_sidecar
from qkov.training_log import TrainingPoint

# 4: three-valued claims with their figures and errors, the phase change's control on an absolute
# scale (its gains and errors), the ICL score's standard error in the training log;
# 3: the copying score stored once (copying.heads), token strings only in ``tokens``, an undecided
# phase change (no 1-layer control) null; 2: the phase change by Olsson et al.'s signatures
SCHEMA_VERSION = 4
SCHEMA_FILE = Path(__file__).parent / "schema" / "results.schema.json"


# -- one checkpoint, and the reproduction ---------------------------------------------------------
EVERY_STEP = "every step that applies"  # StepsRun.chosen when neither --steps nor --weights-only chose


@dataclass(frozen=True)
class StepsRun:
    """Which analysis steps ran (:func:`qkov.analyze.plan_steps`): ``chosen`` says how they were
    chosen (every step that applies, ``--weights-only``, ``--steps``), ``ran`` names them in the
    order run, and ``added`` maps each step run only because a chosen one reads its result to the
    steps that read it. ``Results.skipped`` says why each other step did not run."""

    chosen: str
    ran: list[str]
    added: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Results:
    """Every analysis of one checkpoint (``results.json`` of ``qkov analyze``). An analysis that
    does not apply to the model (composition needs two layers, the bigram comparison a corpus) is
    ``None``, and ``skipped`` maps its name to the reason (``steps`` says which ran, and how they
    were chosen; None in a file written before it was kept); ``circuit_notes`` says, one sentence per
    feature of the model (rotary positions, query/key norms, norms after each sublayer, soft-caps),
    which offset the weight-based circuits use or up to what scale they are exact."""

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
    term_importance: TermImportance | None = None
    skip_trigrams: SkipTrigrams | None = None
    composition: Composition | None = None
    induction_check: list[InductionCheck] | None = None
    induction_mechanism: list[InductionMechanism] | None = None
    correction: Correction | None = None
    circuit: Circuit | None = None
    ablation: list[AblationEffect] | None = None
    neurons: Neurons | None = None
    ablation_estimate: AblationEstimate | None = None
    task: Task | None = None
    rotary_bands: RotaryBands | None = None
    gqa_groups: list[GroupSimilarity] | None = None
    skipped: dict[str, str] = field(default_factory=dict)
    circuit_notes: list[str] = field(default_factory=list)
    steps: StepsRun | None = None


@dataclass(frozen=True)
class Claim:
    """One of the paper's claims, the measurement here, the rule that decides it, and its verdict:
    ``verdict`` is "holds", "does not hold" or "undetermined" (:mod:`qkov.numbers`). ``figure`` is
    the number the rule reads, ``error`` its standard error (None where the figure is exact, a count
    of heads or of skip-trigrams, or where its error is not measured: ``note`` says which),
    ``interval`` the range the verdict reads (95%, or what the figure's own uncertainty spans) and
    ``threshold`` what it is read against; ``note`` also says why a verdict is undetermined and
    what a figure covers."""

    claim: str
    paper: str
    measured: str
    rule: str
    verdict: str
    figure: float | None = None
    error: float | None = None
    interval: tuple[float, float] | None = None
    threshold: float | None = None
    note: str = ""

    @property
    def holds(self) -> bool | None:
        """The verdict as True ("holds"), False ("does not hold") or None ("undetermined")."""
        return {HOLDS: True, FAILS: False}.get(self.verdict)


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


JSON_TREE: TypeAdapter[Any] = TypeAdapter(Any)


def write_results(results: Results | Reproduction, folder: Path) -> Path:
    """``folder/results.json``, written atomically; its big arrays, if any, first in the sidecar
    beside it (:mod:`qkov.sidecar`), and a sidecar an earlier run left there removed when none is."""
    file = folder / "results.json"
    data = ANY_RESULTS.dump_python(results, mode="json")
    tensors, described = split_arrays(data, file)
    if tensors:
        write_sidecar(file, tensors, described)
        atomic_write_text(file, JSON_TREE.dump_json(data, indent=1).decode() + "\n")
    else:
        atomic_write_text(file, to_json(results))
        sidecar_file(file).unlink(missing_ok=True)
    return file


def _validation_message(err: ValidationError) -> str:
    first = err.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "top level"
    return f"{where}: {first['msg']} ({err.error_count()} problem(s) in all)"


def load_results(path: str | Path) -> Results | Reproduction:
    """Read a ``results.json`` (of ``qkov analyze`` or ``qkov reproduce``) into its typed form, with
    the arrays it keeps in its sidecar (:mod:`qkov.sidecar`) put back.

    Raises :class:`QkovError` with one line for a missing or unreadable file, a ``schema_version``
    this qkov does not read, a missing, damaged or mismatched sidecar, or a field of the wrong type."""
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
    join_arrays(data, file)
    adapter = TypeAdapter(Reproduction if "models" in data else Results)
    try:
        return adapter.validate_python(data)
    except ValidationError as err:
        raise QkovError(f"{file}: {_validation_message(err)}") from None


def referenced_def(prop: dict[str, Any]) -> str:
    """The name of the ``$defs`` entry a property refers to (directly or as one of ``anyOf``)."""
    refs = [prop.get("$ref")] + [alt.get("$ref") for alt in prop.get("anyOf", [])]
    return next(ref for ref in refs if ref is not None).rsplit("/", 1)[-1]


def allow_sidecar_refs(schema: dict[str, Any]) -> None:
    """Let each field of :data:`~qkov.sidecar.SIDECAR_FIELDS` be a :class:`~qkov.sidecar.SidecarRef`
    instead: what ``results.json`` holds in its place when its rows are in the sidecar."""
    defs = schema["$defs"]
    defs["SidecarRef"] = TypeAdapter(SidecarRef).json_schema(mode="serialization")
    for path in SIDECAR_FIELDS:
        owner = "Results"
        for part in path[:-1]:
            owner = referenced_def(defs[owner]["properties"][part])
        prop = defs[owner]["properties"][path[-1]]
        kept = {key: prop.pop(key) for key in ("title", "default", "description") if key in prop}
        alternatives = prop["anyOf"] if list(prop) == ["anyOf"] else [prop]
        reference = {"$ref": "#/$defs/SidecarRef"}
        defs[owner]["properties"][path[-1]] = kept | {"anyOf": [*alternatives, reference]}


def json_schema() -> dict[str, Any]:
    """The JSON Schema of ``results.json``, generated from these types (either kind of file), where
    the fields that may be kept in the sidecar (:mod:`qkov.sidecar`) may also be its reference."""
    schema = ANY_RESULTS.json_schema(mode="serialization")
    allow_sidecar_refs(schema)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"qkov results.json, schema_version {SCHEMA_VERSION}",
    } | schema


def schema_text() -> str:
    return json.dumps(json_schema(), indent=1, sort_keys=True) + "\n"
