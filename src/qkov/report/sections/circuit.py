"""The circuit read off the weights: roles and weighted Q/K/V edges."""

from __future__ import annotations

from qkov.report.markup import figure, table
from qkov.report.svg import circuit_diagram
from qkov.results import Results


def circuit_section(r: Results) -> str:
    circuit = r.circuit
    if circuit is None:
        return ""
    layers: list[list[tuple[str, str]]] = []
    for node in circuit.nodes:
        while len(layers) <= node.layer:
            layers.append([])
        layers[node.layer].append((node.head, ", ".join(role.replace("_", " ") for role in node.roles)))
    edges = [(e.writer, e.reader, e.kind, e.weight) for e in circuit.edges]
    rows = [[e.writer, e.reader, e.kind, f"{e.weight:+.2f}", e.name] for e in circuit.edges]
    return figure(
        circuit_diagram(layers, edges, "circuit graph")
        + table(["writer", "reader", "kind", "weight", "ACDC name"], rows),
        f"The circuit read off the weights on {circuit.tokens}: heads with their roles, and every "
        f"Q-, K- and V-composition edge whose share of what the reader reads is at least "
        f"{circuit.threshold:g} in size (Q, K: of the variation of its scores; V: of its write), with "
        "attention and LayerNorm scales frozen. Dashed: a negative share.",
    )
