"""The ``results.json`` key table, generated from the schema at every build (Sphinx extension).

It writes ``_generated/results-keys.md`` from :func:`qkov.results.json_schema` before the sources
are read: one table per object type (``Reproduction`` and ``Results`` first), each key with its
JSON type, types linking to their own tables. Nothing is written by hand, so the page cannot fall
behind the schema.
"""

from __future__ import annotations

from pathlib import Path

from qkov.results import SCHEMA_VERSION, json_schema

FIRST = ("Reproduction", "Results")


def type_text(schema: dict) -> str:
    """A JSON Schema type as a reader says it: ``list of [HeadCopying](#headcopying)``."""
    if isinstance(schema, bool):  # ``true``: any value (an object of free-form values, rotary_scaling's)
        return "any"
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if "anyOf" in schema:
        kinds = [type_text(s) for s in schema["anyOf"] if s.get("type") != "null"]
        nullable = len(kinds) < len(schema["anyOf"])
        return " or ".join(kinds) + (" or null" if nullable else "")
    kind = schema.get("type")
    if kind == "array" and "prefixItems" in schema:
        return "[" + ", ".join(type_text(s) for s in schema["prefixItems"]) + "]"
    if kind == "array":
        return "list of " + type_text(schema.get("items", {}))
    if kind == "object":
        return "object of " + type_text(schema.get("additionalProperties", {}))
    return {"number": "number", "integer": "integer", "string": "string", "boolean": "boolean"}.get(kind, "any")


def table(name: str, schema: dict) -> str:
    description = " ".join(schema.get("description", "").split())
    rows = [
        f"| `{key}` | {type_text(prop)} | {'yes' if key in schema.get('required', []) else 'no'} |"
        for key, prop in schema.get("properties", {}).items()
    ]
    return "\n".join([f"## {name}", "", description, "", "| key | type | required |", "|---|---|---|", *rows, ""])


def page() -> str:
    defs = json_schema()["$defs"]
    names = [n for n in FIRST if n in defs] + sorted(n for n in defs if n not in FIRST)
    intro = (
        f"# results.json keys\n\nEvery key of `results.json`, schema_version {SCHEMA_VERSION}: the file of "
        "`qkov reproduce` is a `Reproduction`, that of `qkov analyze` a `Results`. Generated from the "
        "schema (`qkov.results.json_schema()`, shipped as `src/qkov/schema/results.schema.json`) at every "
        "build. Read a file back with `qkov.load_results(path)`.\n"
    )
    return intro + "\n" + "\n".join(table(name, defs[name]) for name in names)


def write(app) -> None:
    out = Path(app.srcdir) / "_generated" / "results-keys.md"
    out.parent.mkdir(exist_ok=True)
    text = page()
    if not out.exists() or out.read_text() != text:  # unchanged: Sphinx need not reread it
        out.write_text(text)


def setup(app):
    app.connect("builder-inited", write)
    return {"parallel_read_safe": True}
