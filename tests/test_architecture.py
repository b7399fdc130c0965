"""The house's shape, checked on the source: every module imports only from its own layer or a lower
one, no two modules import each other (directly or around a circle), no function is longer than a
screen, and importing the library loads neither the trainer nor the renderer.

The layers, lowest first (``qkov.x`` is ``x``; a package stands for all its modules):

0. foundations: errors, io, numbers, config, names, linalg, topk, loss, machine, distributed, pickles,
   training_log, sizes, tensorfile
1. the model, its files and the data it reads: model, cache, hooks, text, checkpoint, data
2. models in and out: interop, and the hand-written models whose answers are known (handbuilt)
3. the paper's ideas, one module each: circuits
4. what runs them: evaluation, train, training_run, recipes, results, sidecar, context, analyze, claims,
   series
5. what shows them: report, serve, view
6. commands: reproduce, cli, the package itself (``qkov/__init__.py``, ``__main__``)
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "qkov"
LAYERS = (
    {
        "errors",
        "io",
        "numbers",
        "config",
        "names",
        "linalg",
        "tall",
        "topk",
        "loss",
        "machine",
        "distributed",
        "pickles",
        "rotary",
        "schedule",
        "hub_cache",
    }
    | {"training_log", "sizes", "tensorfile"},
    {"model", "cache", "hooks", "text", "checkpoint", "data"},
    {"interop", "handbuilt"},
    {"circuits"},
    {"evaluation", "train", "training_run", "recipes", "results", "sidecar", "context", "analyze", "claims"}
    | {"series"},
    {"report", "serve", "view"},
    {"reproduce", "cli", "__init__", "__main__"},
)
MAX_FUNCTION_LINES = 60


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)


def layer_of(module: str) -> int:
    top = module.split(".")[0]
    for layer, names in enumerate(LAYERS):
        if top in names:
            return layer
    raise AssertionError(f"{module} is in no layer of tests/test_architecture.py: place it there")


def imports() -> dict[str, set[str]]:
    """Every module's imports of other qkov modules, wherever in the file they are."""
    modules = {module_name(path): path for path in SRC.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.ImportFrom)
                and node.level == 0
                and (node.module or "").startswith("qkov")
            ):
                for alias in node.names:
                    target = f"{node.module}.{alias.name}"[len("qkov.") :]
                    found.add(target if target in modules else node.module[len("qkov.") :] or "__init__")
            elif isinstance(node, ast.Import):  # ``import qkov`` is the package itself, the top layer
                found |= {
                    a.name[len("qkov.") :] or "__init__" for a in node.names if a.name.split(".")[0] == "qkov"
                }
        graph[name] = {target for target in found if target and target != name}
    return graph


def test_every_import_runs_down_the_layers():
    upward = [
        f"{module} (layer {layer_of(module)}) imports {target} (layer {layer_of(target)})"
        for module, targets in imports().items()
        for target in targets
        if layer_of(target) > layer_of(module)
    ]
    assert upward == []


def test_no_modules_import_each_other_around_a_circle():
    graph, state, circles = imports(), {}, []

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":
                circles.append(path[path.index(target) :] + [target])
            elif target not in state and target in graph:
                visit(target, [*path, target])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert circles == []


def test_no_function_is_longer_than_a_screen():
    long = [
        f"{path.relative_to(SRC)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in SRC.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert long == []


@pytest.mark.parametrize(
    "module, absent",
    [
        ("qkov", ("torch", "qkov.train", "qkov.distributed", "qkov.report")),
        ("qkov.serve", ("qkov.report", "qkov.train")),
        ("qkov.cli", ("torch",)),  # qkov --version, --help and argument errors answer at once
    ],
)
def test_importing_loads_only_what_it_needs(module, absent):
    loaded = subprocess.run(
        [sys.executable, "-c", f"import sys, {module}; print(' '.join(sorted(sys.modules)))"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert [name for name in absent if name in loaded] == []
