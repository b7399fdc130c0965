"""The corrected composition picture and the circuit graph: the survey behind
``docs/experiments/correction-and-circuit.md`` (the paper's correction: induction heads that also
rely on "a head which attends to the last several tokens"; the circuit read off the weights).

For every model given as ``NAME=FOLDER`` (a qkov checkpoint folder; ``NAME=FOLDER@P`` reads it on
sequences of period ``P`` instead of ``analyze``'s), this runs ``qkov analyze``'s own
``correction`` and ``circuit`` steps (same seeded repeated random tokens, same budgets, same rules:
:mod:`qkov.circuits.correction`, :mod:`qkov.circuits.circuit`) and prints, per model, the
several-recent-tokens heads with their window k, each induction head's key shares by layer-0
head, the minimal circuit's share, and the circuit's edges.

    .venv/bin/python studies/correction.py "qkov shortformer=/tmp/h4-models/short2" ...
"""

from __future__ import annotations

import argparse
import os
import platform

import torch

import qkov
from qkov.analyze import run_steps
from qkov.circuits.circuit import circuit_graph, head_roles
from qkov.circuits.copying import copying_analysis
from qkov.circuits.correction import correction
from qkov.circuits.repeated import repeated_token_behaviour
from qkov.context import REPEAT_BATCH, REPEATS
from qkov.data.random_tokens import repeated_random_tokens


def steps_for(model: qkov.Transformer, seed: int, period: int | None) -> tuple:
    """``(repeated_tokens, correction, circuit)`` as ``analyze`` computes them, or on ``REPEAT_BATCH``
    sequences of ``period`` drawn from ``seed`` when given (the rules unchanged)."""
    if period is None:
        done = run_steps(model, ["circuit"], seed=seed)
        return done["repeated_tokens"], done["correction"], done["circuit"]
    gen = torch.Generator().manual_seed(seed)
    bos = model.cfg.bos_token_id
    tokens = repeated_random_tokens(REPEAT_BATCH, period, REPEATS, model.cfg.d_vocab, gen, bos)
    with torch.no_grad():
        behaviour = repeated_token_behaviour(model, tokens, period, REPEATS, bos)
        heads = (behaviour.induction_heads, behaviour.previous_token_heads)
        described = f"repeated random tokens of period {period}"
        found = correction(model, tokens, period, *heads, described, start=int(bos is not None))
        roles = head_roles(behaviour, copying_analysis(model), found)
        return behaviour, found, circuit_graph(model, tokens, roles, described)


def report(name: str, behaviour, found, circuit) -> None:
    print(f"\n## {name}  ({found.tokens}, period {found.period})")
    print(f"previous-token heads: {behaviour.previous_token_heads}")
    print(f"induction heads: {behaviour.induction_heads}")
    recent = [f"{h.head} (k={h.window}, key pos {h.key_position_share:.2f})" for h in found.heads if h.recent]
    print(f"several-recent-tokens heads: {', '.join(recent) or 'none'}")
    for h in found.heads:
        if h.head.startswith("L0"):
            offsets = " ".join(f"{o:.2f}" for o in h.offsets)
            print(f"  {h.head}: k={h.window} offsets [{offsets}] key-pos share {h.key_position_share}")
    for w in found.writers:
        keys = "  ".join(f"{head} {share:+.3f}" for head, share in w.key.items() if share is not None)
        print(f"writers of {w.head} (key shares): {keys}  | beyond previous-token: {w.beyond_previous}")
    m = found.minimal
    if m is not None:
        share = "undefined" if m.share is None else f"{m.share:.3f}"
        losses = f"full {m.loss_full:.3f}, minimal {m.loss_minimal:.3f}, without {m.loss_without:.3f}"
        heads = f"{m.previous_token_heads} -> {m.induction_heads}"
        print(f"minimal circuit {heads}: loss {losses}; share {share}")
    print(f"circuit ({len(circuit.edges)} edges, |weight| >= {circuit.threshold}):")
    for node in circuit.nodes:
        if node.roles:
            print(f"  {node.head}: {', '.join(node.roles)}")
    for e in sorted(circuit.edges, key=lambda e: -abs(e.weight)):
        print(f"  {e.writer} -{e.kind}-> {e.reader} {e.weight:+.3f}  {e.name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", help="NAME=FOLDER or NAME=FOLDER@PERIOD")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("THREADS", "1")))
    print(f"machine: {platform.processor() or platform.machine()}, threads {torch.get_num_threads()}")
    print(f"torch {torch.__version__}, seed {args.seed}")
    for spec in args.models:
        name, _, folder = spec.partition("=")
        folder, _, period = folder.partition("@")
        model = qkov.load(folder).eval()
        report(name, *steps_for(model, args.seed, int(period) if period else None))


if __name__ == "__main__":
    main()
