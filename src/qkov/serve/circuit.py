"""The circuit view of ``qkov serve``: the circuit graph ``qkov analyze`` writes to ``results.json``
(:mod:`qkov.circuits.circuit`: heads with their roles, Q/K/V edges weighted by their exact share of
what the reader reads), from analyze's own step on analyze's seeded inputs, so the page draws the
numbers the file holds; each edge carries its attribution by the writer's parts, shown on a click.
"""

from __future__ import annotations

from dataclasses import asdict

from qkov.analyze import STEPS, run_steps
from qkov.errors import QkovError
from qkov.serve.explorer import Explorer
from qkov.serve.head import SEED
from qkov.serve.jobs import Progress


def circuit_view(ex: Explorer, progress: Progress) -> dict:
    """The circuit graph, as ``results.json``'s ``circuit``."""
    progress.step(0, 1, "roles, and every edge's share from the exact score attribution")
    return asdict(run_steps(ex.model, ["circuit"], seed=SEED)["circuit"])


def check_circuit(ex: Explorer) -> None:
    """Refuse a model the circuit does not apply to (one line, as ``analyze``'s skip reason)."""
    step = next(s for s in STEPS if s.name == "circuit")
    reason = step.skip_reason(ex.cfg, has_corpus=False)
    if reason is not None:
        raise QkovError(f"no circuit graph for this model: {reason}")
