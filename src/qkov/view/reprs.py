"""``_repr_html_`` for every result type, so that a notebook shows a result as the report draws it.

The result types live in :mod:`qkov.circuits` and :mod:`qkov.results`, which must not import the
report; :func:`install` sets the method on each class from here instead. The classes are found from
the type hints of :class:`~qkov.results.Results` and :class:`~qkov.results.Reproduction` (every
dataclass they hold, however deep), so a new analysis' result type gets a view with no change here:
its report section (``report.sections.SECTIONS``, keyed by its ``Results`` field) when it has one,
else a table of its fields (:func:`dataclass_html`). The renderers are the report's own; the report
modules are imported only when something is shown.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable

from qkov.circuits.paths import PathTerms
from qkov.config import Config
from qkov.model import Transformer
from qkov.results import Reproduction, Results

MAX_ROWS = 20  # rows of a nested list shown in a field table; the rest are counted
NOT_SECTIONS = ("config", "tokens", "schema_version", "training", "phase_change")


class IdStrings:
    """Token strings for a result shown without its ``Results``: each token reads as ``#id``."""

    def __getitem__(self, token: int) -> str:
        return f"#{token}"


def _dataclasses_in(hint: object, found: dict[type, str | None], field: str | None) -> None:
    """Every dataclass in a type hint (through ``X | None``, ``list[X]``, ``dict[str, X]``), each
    with the ``Results`` field that holds it directly (``None`` when nested or in a list)."""
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        if hint not in found or (field and not found[hint]):
            found[hint] = field
            for inner in typing.get_type_hints(hint).values():
                _dataclasses_in(inner, found, None)
        return
    args = typing.get_args(hint)
    origin = typing.get_origin(hint)
    direct = field if origin in (typing.Union, types.UnionType) else None
    for arg in args:
        _dataclasses_in(arg, found, direct)


def result_types() -> dict[type, str | None]:
    """Every dataclass a ``results.json`` can hold, with its ``Results`` field when it is one."""
    found: dict[type, str | None] = {}
    for name, hint in typing.get_type_hints(Results).items():
        _dataclasses_in(hint, found, name)
    _dataclasses_in(Reproduction, found, None)
    return found


def _cell(value: object) -> object:
    """A field value as a table cell: numbers and strings as they are, shapes for tensors, a
    count for nested results."""
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"tensor {list(value.shape)} {value.dtype}"
    if dataclasses.is_dataclass(value):
        return type(value).__name__
    if isinstance(value, list | tuple) and value and not dataclasses.is_dataclass(value[0]):
        shown = ", ".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in value[:8])
        return f"[{shown}{', …' if len(value) > 8 else ''}]"
    if isinstance(value, list | tuple | dict) and value:
        return f"{len(value)} item(s)"
    return value


def _rows_table(rows: list) -> str:
    """A list of results of one type as one table, a row each (the first ``MAX_ROWS``)."""
    from qkov.report.markup import table

    names = [f.name for f in dataclasses.fields(rows[0])]
    cells = [[_cell(getattr(row, name)) for name in names] for row in rows[:MAX_ROWS]]
    more = f"<p class='small'>… and {len(rows) - MAX_ROWS} more</p>" if len(rows) > MAX_ROWS else ""
    return table(names, cells) + more


def dataclass_html(result: object) -> str:
    """Any result: its plain fields as a table, then each list of results (or mapping of such
    lists) as a table of its own."""
    from qkov.report.markup import table
    from qkov.report.svg import esc

    plain, nested = [], []
    for field in dataclasses.fields(result):
        value = getattr(result, field.name)
        lists = value.items() if isinstance(value, dict) else [(field.name, value)]
        groups = [(k, v) for k, v in lists if isinstance(v, list) and v and dataclasses.is_dataclass(v[0])]
        if groups and len(groups) == len(lists):
            nested += [(f"{field.name}: {k}" if k != field.name else k, v) for k, v in groups]
        elif dataclasses.is_dataclass(value):
            nested.append((field.name, value))
        else:
            plain.append([field.name, _cell(value)])
    parts = [f"<h4>{esc(type(result).__name__)}</h4>", table(["field", "value"], plain) if plain else ""]
    for name, value in nested:
        inner = _rows_table(value) if isinstance(value, list) else dataclass_html(value)
        parts.append(f"<h5>{esc(name)}</h5>{inner}")
    return "".join(parts)


def holding(field: str, value: object, tokens=None) -> Results:
    """A ``Results`` holding one analysis, for its report section: sections read their own field
    and the token strings only (``#id`` when not given)."""
    return Results(
        config=None, tokens=tokens or IdStrings(), training=[], phase_change=None, **{field: value}
    )


def result_html(field: str | None) -> Callable[[object], str]:
    """The renderer of a result held in the ``Results`` field ``field``: its report section, or
    its field table when it has none (or the section needs other analyses too and draws nothing)."""

    def render(result: object) -> str:
        from qkov.report.sections import SECTIONS

        section = SECTIONS.get(field) if field else None
        return (section(holding(field, result)) if section else "") or dataclass_html(result)

    return render


def _titles() -> dict[str, str]:
    from qkov.analyze import STEPS

    return {"training": "Training", "steps": "Analyses run"} | {step.name: step.title for step in STEPS}


def results_html(r: Results) -> str:
    """One checkpoint's analysis: the model's settings, the phase change, then every analysis in
    report order, each folded under its title (``<details>``)."""
    from qkov.report.markup import table
    from qkov.report.sections import SECTIONS, model_header, phase_change_section
    from qkov.report.svg import esc

    titles = _titles()
    parts = [model_header(r), phase_change_section({"this model": r}) if r.phase_change else ""]
    shown = set()
    for field, section in SECTIONS.items():
        html = section(r)
        if html:
            shown.add(field)
            parts.append(f"<details><summary>{esc(titles.get(field, field))}</summary>{html}</details>")
    for field in (f.name for f in dataclasses.fields(r)):
        value = getattr(r, field)
        if field in shown or field in NOT_SECTIONS or value is None or value == {} or value == []:
            continue
        rows = value if isinstance(value, list) else None
        if rows is not None:
            html = _rows_table(rows)
        elif dataclasses.is_dataclass(value):
            html = dataclass_html(value)
        else:  # a mapping of plain values, such as the steps skipped and why
            html = table(["", ""], [[key, item] for key, item in dict(value).items()])
        if html:  # an analysis without a report section: its fields
            parts.append(f"<details><summary>{esc(titles.get(field, field))}</summary>{html}</details>")
    return "".join(parts)


def reproduction_html(rep: Reproduction) -> str:
    """The claims table, the phase change across the models, then each model folded."""
    from qkov.report.sections import claims_section, phase_change_section
    from qkov.report.svg import esc

    models = "".join(
        f"<details><summary>{esc(name)} model</summary>{results_html(r)}</details>"
        for name, r in rep.models.items()
    )
    return claims_section(rep.claims) + phase_change_section(rep.models) + models


def model_html(model: Transformer) -> str:
    """A model's settings (the report's header) and its weights' names and shapes."""
    from qkov.report.markup import table
    from qkov.report.sections import model_header

    header = model_header(Results(config=model.cfg, tokens=[], training=[], phase_change=None))
    rows = [[name, str(list(p.shape))] for name, p in model.named_parameters()]
    total = sum(p.numel() for p in model.parameters())
    return header + table(["weight", "shape"], rows) + f"<p class='small'>{total:,} parameters</p>"


def config_html(cfg: Config) -> str:
    from qkov.report.markup import table

    return table(["setting", "value"], [[k, v] for k, v in cfg.to_dict().items()])


def path_terms_html(terms: PathTerms) -> str:
    """Each path's term by its root mean square logit, as bars (the direct path first)."""
    from qkov.report.svg import bars

    items = [(terms.label(key), float(term.double().pow(2).mean().sqrt())) for key, term in terms.items()]
    shape = next(iter(terms.values())).shape
    return bars(items, f"root mean square logit of each term, over {list(shape)}", "path expansion")


def _method(render: Callable[[object], str]) -> Callable[[object], str]:
    def _repr_html_(self) -> str:
        from qkov.view.frame import wrap

        return wrap(render(self))

    return _repr_html_


def renderers() -> dict[type, Callable[[object], str]]:
    """Every type given a ``_repr_html_``, with its renderer (an HTML fragment)."""
    found = {cls: result_html(field) for cls, field in result_types().items()}
    return found | {
        Results: results_html,
        Reproduction: reproduction_html,
        Config: config_html,
        Transformer: model_html,
        PathTerms: path_terms_html,
    }


def install() -> None:
    """Give every result type, a model, and path expansion's output a ``_repr_html_``."""
    for cls, render in renderers().items():
        cls._repr_html_ = _method(render)
