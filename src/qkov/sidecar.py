"""The big arrays of ``results.json`` in a safetensors file beside it, read back transparently.

At 1,024 heads every pair's composition scores are half a million rows of each kind, and each later
head's induction check has a row per earlier head: as JSON, a quarter of a gigabyte. A field of
:data:`SIDECAR_FIELDS` that holds at least :data:`SIDECAR_MIN_VALUES` numbers is written instead to
``results.arrays.safetensors`` beside ``results.json`` (:func:`sidecar_file`), one tensor per column,
and ``results.json`` keeps in its place a reference: ``{"sidecar": file name, "key": the field,
"rows": how many, "sha256": the file's checksum}`` (:class:`SidecarRef`). Smaller
fields stay inline, so a small model's ``results.json`` is written byte for byte as before and has
no sidecar. :func:`qkov.load_results` puts the rows back before validating, so the typed results
are the same either way.

Columns, for a list of rows that all have the same keys: a value every row shares is kept once in
the file's metadata; strings as ``int32`` indices into a table in the metadata (head names: at most
one entry per head); numbers as ``float64`` (``NaN`` for ``null``: results hold no NaN, see
:mod:`qkov.numbers`) or ``int64`` when every value is an integer; a ``{name: number}`` mapping per
row as three tensors, its keys (indices into a table), values and each row's offset. A field whose
rows do not fit these shapes stays inline. The file carries :mod:`qkov.tensorfile`'s checksum of its
tensors, and ``results.json`` names the checksum of those and of the columns' descriptions together
(:func:`sidecar_checksum`), so a damaged sidecar, or one from another run, is refused in one line.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from qkov.errors import QkovError
from qkov.tensorfile import CHECKSUM_KEY, read_tensor_file, tensors_checksum, write_tensors

SIDECAR_SUFFIX = ".arrays.safetensors"
COLUMNS_KEY = "qkov_columns"  # the sidecar's metadata: each field's rows and its columns' encodings
# A field holding at least this many numbers (about half a megabyte of JSON) goes to the sidecar: a
# 2-layer model of 8 heads keeps its 64 pairs of each kind inline, GPT-2 small's 9,504 go beside.
SIDECAR_MIN_VALUES = 10_000
# The lists of rows that may go to the sidecar, as paths in one model's results.
SIDECAR_FIELDS: tuple[tuple[str, ...], ...] = (
    ("composition", "Q"),
    ("composition", "K"),
    ("composition", "V"),
    ("induction_check",),
)
REF_KEYS = frozenset({"sidecar", "key", "rows", "sha256"})


@dataclass(frozen=True)
class SidecarRef:
    """In ``results.json``, in place of a field kept in the sidecar: the sidecar's file name (beside
    ``results.json``), the field's key in it, its number of rows, and the sidecar's checksum
    (:func:`sidecar_checksum`)."""

    sidecar: str
    key: str
    rows: int
    sha256: str


def sidecar_checksum(tensors_sha256: str, columns: str) -> str:
    """The SHA-256 of the tensors' checksum (:func:`qkov.tensorfile.tensors_checksum`) and the
    columns' descriptions (the metadata's JSON text): what ``results.json`` names."""
    return hashlib.sha256(json.dumps([tensors_sha256, columns]).encode()).hexdigest()


def sidecar_file(results_file: Path) -> Path:
    """``results.arrays.safetensors`` beside ``results.json`` (any name: ``NAME.arrays.safetensors``)."""
    return results_file.with_name(results_file.stem + SIDECAR_SUFFIX)


def model_roots(data: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each model's results in a ``results.json`` tree, with its key's prefix: the file itself for
    ``qkov analyze``'s, each of ``models`` for ``qkov reproduce``'s."""
    models = data.get("models")
    if isinstance(models, dict):
        for name, model in models.items():
            if isinstance(model, dict):
                yield f"models.{name}.", model
    else:
        yield "", data


def field_slots(data: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any], str]]:
    """Every field of :data:`SIDECAR_FIELDS` present in the tree: its key, its parent and its name."""
    for prefix, root in model_roots(data):
        for path in SIDECAR_FIELDS:
            parent: Any = root
            for part in path[:-1]:
                parent = parent.get(part) if isinstance(parent, dict) else None
            if isinstance(parent, dict) and parent.get(path[-1]) is not None:
                yield prefix + ".".join(path), parent, path[-1]


# -- columns ----------------------------------------------------------------------------------------
def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def encode_column(name: str, values: list[Any], tensors: dict[str, torch.Tensor]) -> dict | None:
    """One column's encoding (module docstring), its tensors added to ``tensors``; None when its
    values fit no encoding."""
    first = values[0]
    if not isinstance(first, dict | list) and all(v == first and type(v) is type(first) for v in values):
        return {"kind": "constant", "value": first}
    if all(isinstance(v, str) for v in values):
        table = list(dict.fromkeys(values))
        index = {s: i for i, s in enumerate(table)}
        tensors[name] = torch.tensor([index[v] for v in values], dtype=torch.int32)
        return {"kind": "string", "table": table}
    if all(type(v) is int for v in values):
        tensors[name] = torch.tensor(values, dtype=torch.int64)
        return {"kind": "integer"}
    if all(v is None or is_number(v) for v in values):
        tensors[name] = torch.tensor([math.nan if v is None else v for v in values], dtype=torch.float64)
        return {"kind": "number"}
    if all(isinstance(v, dict) and all(v2 is None or is_number(v2) for v2 in v.values()) for v in values):
        table = list(dict.fromkeys(k for v in values for k in v))
        index = {s: i for i, s in enumerate(table)}
        tensors[name + ".keys"] = torch.tensor([index[k] for v in values for k in v], dtype=torch.int32)
        numbers = [math.nan if x is None else x for v in values for x in v.values()]
        tensors[name + ".values"] = torch.tensor(numbers, dtype=torch.float64)
        offsets = [0]
        for v in values:
            offsets.append(offsets[-1] + len(v))
        tensors[name + ".offsets"] = torch.tensor(offsets, dtype=torch.int64)
        return {"kind": "mapping", "table": table}
    return None


def decode_column(name: str, spec: dict, rows: int, tensors: dict[str, torch.Tensor]) -> list[Any]:
    """The values of one column back from its encoding (KeyError or IndexError when the file does
    not hold them)."""
    kind = spec["kind"]
    if kind == "constant":
        return [spec["value"]] * rows
    if kind == "string":
        table = spec["table"]
        return [table[i] for i in tensors[name].tolist()]
    if kind == "integer":
        return tensors[name].tolist()
    if kind == "number":
        return [None if math.isnan(x) else x for x in tensors[name].tolist()]
    table = spec["table"]
    keys, values = tensors[name + ".keys"].tolist(), tensors[name + ".values"].tolist()
    offsets = tensors[name + ".offsets"].tolist()
    return [
        {table[keys[j]]: None if math.isnan(values[j]) else values[j] for j in range(start, end)}
        for start, end in zip(offsets[:rows], offsets[1 : rows + 1], strict=True)
    ]


def count_numbers(rows: list[Any]) -> int:
    """How many numbers (and strings) a list of rows holds, counting into mappings."""
    if not rows or not isinstance(rows[0], dict):
        return len(rows)
    return sum(len(v) if isinstance(v, dict) else 1 for row in rows for v in row.values())


def encode_rows(key: str, rows: list[Any], tensors: dict[str, torch.Tensor]) -> dict | None:
    """A list of rows as columns (module docstring), or None when it stays inline: too few numbers,
    rows that are not objects with the same keys, or a column that fits no encoding."""
    if count_numbers(rows) < SIDECAR_MIN_VALUES or not all(isinstance(row, dict) for row in rows):
        return None
    names = list(rows[0])
    if any(list(row) != names for row in rows):
        return None
    added: dict[str, torch.Tensor] = {}
    columns = {}
    for name in names:
        spec = encode_column(f"{key}.{name}", [row[name] for row in rows], added)
        if spec is None:
            return None
        columns[name] = spec
    tensors.update(added)
    return {"rows": len(rows), "columns": columns}


# -- the file ---------------------------------------------------------------------------------------
def columns_text(described: dict) -> str:
    return json.dumps(described, sort_keys=True)


def split_arrays(data: dict[str, Any], results_file: Path) -> tuple[dict[str, torch.Tensor], dict]:
    """Move the big fields of a ``results.json`` tree (:func:`field_slots`) out of it, in place:
    returns their tensors and the metadata that describes them (empty when every field stays
    inline), and leaves a :class:`SidecarRef` in each one's place (its ``sha256`` filled last)."""
    tensors: dict[str, torch.Tensor] = {}
    described: dict[str, dict] = {}
    refs = []
    for key, parent, name in list(field_slots(data)):
        encoded = encode_rows(key, parent[name], tensors)
        if encoded is not None:
            described[key] = encoded
            parent[name] = {"sidecar": sidecar_file(results_file).name, "key": key, "rows": encoded["rows"]}
            refs.append(parent[name])
    if tensors:
        checksum = sidecar_checksum(tensors_checksum(tensors), columns_text(described))
        for ref in refs:
            ref["sha256"] = checksum
    return tensors, described


def write_sidecar(results_file: Path, tensors: dict[str, torch.Tensor], described: dict) -> None:
    """The sidecar beside ``results_file``, written atomically (:func:`qkov.tensorfile.write_tensors`)."""
    write_tensors(sidecar_file(results_file), tensors, {COLUMNS_KEY: columns_text(described)})


def read_sidecar(results_file: Path, refs: list[tuple[str, dict]]) -> tuple[dict[str, torch.Tensor], dict]:
    """The tensors and column descriptions of the sidecar that ``refs`` (key, reference) name, checked
    against their checksum; one line naming the file when it is missing, damaged or another run's."""
    names = {ref["sidecar"] for _, ref in refs}
    if len(names) != 1 or Path(next(iter(names))).name != next(iter(names)):
        raise QkovError(f"{results_file}: its sidecar references name {sorted(names)}, not one file beside")
    file = results_file.with_name(names.pop())
    keys = ", ".join(key for key, _ in refs)
    if not file.is_file():
        raise QkovError(f"{file}: missing ({results_file.name} keeps {keys} there: restore it or rerun)")
    tensors, metadata = read_tensor_file(file)
    if CHECKSUM_KEY not in metadata or COLUMNS_KEY not in metadata:
        raise QkovError(f"{file}: no {CHECKSUM_KEY} or {COLUMNS_KEY} in its metadata: not a results sidecar")
    checksum = sidecar_checksum(metadata[CHECKSUM_KEY], metadata[COLUMNS_KEY])
    if any(ref.get("sha256") != checksum for _, ref in refs):
        raise QkovError(
            f"{file}: not the sidecar {results_file.name} was written with (the checksum it names differs): "
            "copy the pair as written, or analyze again"
        )
    return tensors, json.loads(metadata[COLUMNS_KEY])


def rebuild_rows(key: str, field: dict, tensors: dict[str, torch.Tensor]) -> list[dict[str, Any]]:
    """One field's rows from its columns (:func:`decode_column`)."""
    rows, specs = field["rows"], field["columns"]
    columns = {name: decode_column(f"{key}.{name}", spec, rows, tensors) for name, spec in specs.items()}
    return [dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)]


def join_arrays(data: dict[str, Any], results_file: Path) -> None:
    """Put back, in place, every field a ``results.json`` tree keeps in its sidecar (nothing to do,
    and no file read, when it keeps none)."""
    refs = [
        (key, parent, name)
        for key, parent, name in field_slots(data)
        if isinstance(parent[name], dict) and set(parent[name]) == REF_KEYS
    ]
    if not refs:
        return
    tensors, described = read_sidecar(results_file, [(key, parent[name]) for key, parent, name in refs])
    for key, parent, name in refs:
        try:
            rebuilt = rebuild_rows(key, described[key], tensors)
            if len(rebuilt) != parent[name]["rows"]:
                raise ValueError(f"{len(rebuilt)} rows, not {parent[name]['rows']}")
        except (KeyError, IndexError, TypeError, ValueError) as err:
            raise QkovError(f"{sidecar_file(results_file)}: does not hold {key} whole ({err!r})") from None
        parent[name] = rebuilt
