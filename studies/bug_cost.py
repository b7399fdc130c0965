"""How much loss do skip-trigram bugs cost, and does it grow or shrink with capacity? (the paper's
open question, section "One-Layer Attention-Only Transformers").

For each one-layer checkpoint given (trained with ``qkov train --layers 1``), this runs the
skip-trigram step exactly as ``qkov analyze --corpus stdlib`` does (its ``skip_trigrams.bug_cost``
is the ``analyze`` column: 32 random held-out windows) and measures the same bugged terms on the
whole held-out split, cut into consecutive windows of ``n_ctx`` tokens (``--windows`` caps their
number), in chunks of 32 windows averaged: every figure is a sum over positions divided by their
number, and the chunks are the same size, so the chunks' mean is the whole text's. It prints one
row per model, with its training seed, and the machine.

    python studies/bug_cost.py CKPT [CKPT ...] [--windows N] [--seed 0] [--figure FILE.svg]
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from host import machine  # studies/host.py, beside this script

import qkov
from qkov.analyze import run_steps
from qkov.circuits.bug_cost import bug_cost
from qkov.data.shards import corpus_tokens
from qkov.interop.fold import circuit_model
from qkov.io import atomic_write_text
from qkov.report.svg import COLOURS, scatter

CHUNK = 32  # windows per bug_cost call: its float64 logits stay near 0.1 GB at 2048 tokens


def measured(path: Path, windows: int, seed: int) -> dict:
    model = qkov.load(path).eval()
    corpus = corpus_tokens(None, model.tokenizer)
    found = run_steps(model, ["skip_trigrams"], corpus, seed)["skip_trigrams"]
    circuit, n_ctx = circuit_model(model), model.cfg.n_ctx
    available = len(corpus.eval) // n_ctx
    windows = min(windows or available, available) // CHUNK * CHUNK
    text = torch.from_numpy(np.asarray(corpus.eval[: windows * n_ctx], dtype=np.int64)).view(windows, n_ctx)
    every = found.bug_cost.terms  # keep every term's cost, to average each over the chunks
    parts = [bug_cost(circuit, found.bugs, text[i : i + CHUNK], top=every) for i in range(0, windows, CHUNK)]
    mean = lambda values: sum(values) / len(values)  # noqa: E731
    by_head = {h: mean([p.by_head[h] for p in parts]) for h in parts[0].by_head}
    gain = {h: mean([p.head_gain[h] for p in parts]) for h in parts[0].head_gain}
    terms: dict[tuple, list[float]] = defaultdict(list)
    for part in parts:
        for term in part.top:
            terms[(term.head, term.source, term.destination, term.out)].append(term.nats_per_token)
    train = json.loads((path / "train_config.json").read_text())
    cfg = model.cfg
    return {
        "model": path.name,
        "seed": train["seed"],
        "heads x d_head": f"{cfg.n_heads} x {cfg.d_head}",
        "vocab": cfg.d_vocab,
        "tokens (M)": train["steps"] * train["batch_size"] * cfg.n_ctx / 1e6,
        "held-out tokens": windows * n_ctx,
        "terms": found.bug_cost.terms,
        "analyze cost": found.bug_cost.nats_per_token,
        "analyze share": found.bug_cost.share,
        "cost": mean([p.nats_per_token for p in parts]),
        "fires": sum(t.fires for p in parts for t in p.top),
        "heads gain": mean([p.heads_gain for p in parts]),
        "by_head": by_head,
        "head_gain": gain,
        "top": sorted(((key, mean(costs)) for key, costs in terms.items()), key=lambda kv: -kv[1])[:5],
        "strings": [model.tokenizer.decode([i]) for i in range(cfg.d_vocab)],
    }


def span(values: list[float], form: str) -> str:
    """``min to max`` in ``form`` (one value when they print the same)."""
    low, high = form.format(min(values)), form.format(max(values))
    return low if low == high else f"{low} to {high}"


def by_capacity(rows: list[dict]) -> None:
    """One row per shape and training length: the range over its seeds of the cost, the share of the
    heads' gain, the bugged terms and the positions they fired at."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["heads x d_head"], r["vocab"], r["tokens (M)"])].append(r)
    header = "| heads x d_head | vocab | tokens (M) | seeds | bugged terms | positions fired "
    print(f"\nover seeds (min to max):\n\n{header}| cost (nats/token) | share |\n|" + "---|" * 8)
    for (shape, vocab, tokens), found in groups.items():
        print(
            f"| {shape} | {vocab} | {tokens:.1f} | {', '.join(str(r['seed']) for r in found)} "
            f"| {span([r['terms'] for r in found], '{}')} | {span([r['fires'] for r in found], '{}')} "
            f"| {span([r['cost'] for r in found], '{:.1e}')} "
            f"| {span([100 * r['cost'] / r['heads gain'] for r in found], '{:.1e}%')} |"
        )


def figure(rows: list[dict], path: Path) -> None:
    """Each model's cost against the positions its bugged terms fired at, both on log scales, one
    colour per shape and training length, each point named by its model."""
    group = lambda r: (r["heads x d_head"], r["vocab"], r["tokens (M)"])  # noqa: E731
    groups = list(dict.fromkeys(group(r) for r in rows))
    points = [
        {
            "x": math.log10(max(r["fires"], 1)),
            "y": math.log10(max(r["cost"], 1e-12)),
            "text": r["model"],
            "label": f"{r['model']}: {r['cost']:.2e} nats/token, {r['fires']} positions",
            "colour": COLOURS[groups.index(group(r)) % len(COLOURS)],
        }
        for r in rows
    ]
    xs, ys = [p["x"] for p in points], [p["y"] for p in points]
    chart = scatter(
        points,
        "log10 positions fired (of the held-out text)",
        "log10 cost (nats per token)",
        (math.floor(min(xs)), math.ceil(max(xs))),
        (math.floor(min(ys)), math.ceil(max(ys))),
        label="skip-trigram bug cost against the positions the bugged terms fire at",
        width=560,
        height=340,
        zero_lines=False,
    )
    atomic_write_text(path, chart)
    print(f"\nfigure: {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoints", nargs="+", type=Path)
    parser.add_argument("--windows", type=int, default=None, help="at most this many windows")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--figure", type=Path, help="write the cost-against-firings scatter here (SVG)")
    args = parser.parse_args()
    print(f"machine: {machine()}")
    print(f"held-out text: the eval split in consecutive windows of n_ctx tokens; analyze seed {args.seed}\n")
    rows = [measured(path, args.windows, args.seed) for path in args.checkpoints]
    header = (
        "| model | seed | heads x d_head | vocab | tokens (M) | bugged terms | analyze: cost (share) "
        "| held-out tokens | positions fired "
        "| cost (nats/token) | heads' gain | share | costliest head (cost, share of its gain) |"
    )
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for r in rows:
        worst = max(r["by_head"], key=r["by_head"].get)
        share = r["cost"] / r["heads gain"]
        head_share = r["by_head"][worst] / r["head_gain"][worst] if r["head_gain"][worst] else float("nan")
        print(
            f"| {r['model']} | {r['seed']} | {r['heads x d_head']} | {r['vocab']} | {r['tokens (M)']:.1f} "
            f"| {r['terms']} | {r['analyze cost']:.2e} ({100 * (r['analyze share'] or 0):.1e}%) "
            f"| {r['held-out tokens']:,} | {r['fires']} | {r['cost']:.2e} | {r['heads gain']:.3f} "
            f"| {100 * share:.1e}% | {worst} ({r['by_head'][worst]:.2e}, {100 * head_share:.1e}%) |"
        )
    by_capacity(rows)
    print("\ncostliest bugged terms, each removed alone (nats/token):")
    for r in rows:
        s = r["strings"]
        listed = "; ".join(
            f"{head} {s[a]!r} … {s[b]!r} → {s[c]!r} {cost:.2e}" for (head, a, b, c), cost in r["top"]
        )
        print(f"  {r['model']}: {listed}")
    if args.figure:
        figure(rows, args.figure)


if __name__ == "__main__":
    main()
