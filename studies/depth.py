"""Do virtual heads (V-composition) matter more as depth grows? (the paper's open question, section
"Term Importance Analysis": second-order terms were small in its 2-layer model, and the number of
virtual heads grows with depth).

Attention-only models of 1 to 4 layers, one recipe for every depth (``RECIPES``: a model of
``--width``, trained ``--steps`` steps on the default corpus, the same tokens for every depth and
seed), each measured with :func:`qkov.circuits.paths.term_importance` to full depth, on held-out
text (the eval split, consecutive windows of ``n_ctx``) and on repeated random tokens (period
``n_ctx // 2``, twice; the loss of the second repeat, the only predictable half), with the
first-order split by layer. Three commands:

    python studies/depth.py train --layers L --seed S --out DIR [--width cpu|paper|tiny] [--device cuda]
    python studies/depth.py measure DIR [DIR ...] --out FILE.json [--windows 64] [--device cuda]
    python studies/depth.py table FILE.json [FILE.json ...] [--figure FILE.svg [--budget TOKENS]]

``train`` trains one model (one locked command each on a shared machine); ``measure`` appends one
JSON line per model; ``table`` prints the depth x order table of marginal nats (ranges over seeds)
and writes the figure. ``studies/depth_gpu.sh`` runs all three at the paper's width on a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from host import machine  # studies/host.py, beside this script

import qkov
from qkov.circuits.paths import term_importance
from qkov.data.random_tokens import repeated_random_tokens
from qkov.data.shards import corpus_tokens
from qkov.data.user_tokens import IGNORE
from qkov.report.svg import line_chart
from qkov.training_run import TrainingRun, train

# One recipe for every depth: the default 2-layer recipe's shape and optimiser (recipes.py), cut to
# a CPU budget (3.1M tokens, the 1-layer recipe's), with a fixed warm-up so depth is the only change;
# "paper": the paper's width (12 heads of 64, d_model 768) at n_ctx 1024 with 32.8M tokens (the CPU
# recipe's induction heads form by 11-14M): about 3e15 FLOP for the 4-layer model, a minute at an
# assumed 50 TFLOP/s (an estimate, not measured here), so the 12 models fit one lent GPU's session.
RECIPES = {
    "cpu": dict(
        n_heads=4, d_head=32, d_model=128, n_ctx=128, vocab_size=2048, steps=3000, batch_size=8,
        lr=5e-3, warmup_steps=150, schedule="constant", eval_every=1000, checkpoint_every=3000,
    ),
    "paper": dict(
        n_heads=12, d_head=64, d_model=768, n_ctx=1024, vocab_size=2048, steps=2000, batch_size=16,
        lr=1e-3, warmup_steps=100, schedule="constant", eval_every=500, checkpoint_every=1000,
    ),
    "tiny": dict(
        n_heads=2, d_head=8, d_model=16, n_ctx=32, vocab_size=2048, steps=20, batch_size=4,
        lr=5e-3, warmup_steps=2, schedule="constant", eval_every=10, checkpoint_every=20,
    ),
}  # fmt: skip
TEXT_CHUNK = 16  # windows per term_importance call: bounds its logits' memory


def train_one(args: argparse.Namespace) -> None:
    settings = dict(RECIPES[args.width], seed=args.seed) | ({"steps": args.steps} if args.steps else {})
    run = TrainingRun(Path(args.out), args.layers, settings=settings, device=args.device)
    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    start = time.time()
    train(run, show_progress=False)
    print(f"trained {args.out} in {time.time() - start:.0f} s")


def held_out(model: qkov.Transformer, windows: int) -> torch.Tensor:
    """The first ``windows`` consecutive ``n_ctx`` windows of the eval split (fewer if shorter)."""
    corpus = corpus_tokens(None, model.tokenizer)
    n_ctx = model.cfg.n_ctx
    windows = min(windows, len(corpus.eval) // n_ctx)
    text = np.asarray(corpus.eval[: windows * n_ctx], dtype=np.int64)
    return torch.from_numpy(text).view(windows, n_ctx)


def second_repeat_targets(tokens: torch.Tensor, period: int) -> torch.Tensor:
    """The next token as the target at the positions of the second repeat whose next token occurred
    before (``period`` to ``2 period - 2``), ``IGNORE`` elsewhere: the first repeat is random and the
    second's first token follows a token seen only once, so nothing can predict them."""
    targets = torch.full_like(tokens, IGNORE)
    targets[:, period : 2 * period - 1] = tokens[:, period + 1 : 2 * period]
    return targets


def chunked(
    model: qkov.Transformer, tokens: torch.Tensor, described: str, targets: torch.Tensor | None = None
) -> dict:
    """Term importance averaged over equal chunks of sequences (each loss is a mean over the same
    number of positions, so the chunks' mean is the whole batch's)."""
    cut = lambda x, i: None if x is None else x[i : i + TEXT_CHUNK]  # noqa: E731
    starts = range(0, len(tokens), TEXT_CHUNK)
    parts = [term_importance(model, cut(tokens, i), described, cut(targets, i)) for i in starts]
    mean = lambda rows: [float(np.mean(column)) for column in zip(*rows, strict=True)]  # noqa: E731
    return {
        "loss_by_order": mean([p.loss_by_order for p in parts]),
        "marginal": mean([p.marginal for p in parts]),
        "first_order_by_layer": mean([p.first_order_by_layer for p in parts]),
        "tokens": f"{described} ({tokens.shape[0]} x {tokens.shape[1]})",
    }


def measure(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    with open(args.out, "a") as out:
        for folder in args.checkpoints:
            start = time.time()
            model = qkov.load(folder).to(args.device).eval()
            train_cfg = json.loads((folder / "train_config.json").read_text())
            windows = (args.windows // TEXT_CHUNK) * TEXT_CHUNK or TEXT_CHUNK
            text = held_out(model, windows).to(model.device)
            period = model.cfg.n_ctx // 2
            generator = torch.Generator().manual_seed(0)
            repeated = repeated_random_tokens(windows, period, 2, model.cfg.d_vocab, generator)
            repeated = repeated.to(model.device)
            row = {
                "model": str(folder),
                "layers": model.cfg.n_layers,
                "seed": train_cfg["seed"],
                "width": f"{model.cfg.n_heads} x {model.cfg.d_head}, d_model {model.cfg.d_model}",
                "tokens_trained": train_cfg["steps"] * train_cfg["batch_size"] * model.cfg.n_ctx,
                "text": chunked(model, text, "held-out text"),
                "repeated": chunked(
                    model,
                    repeated,
                    f"repeated random tokens (period {period}, twice; loss on the second repeat)",
                    second_repeat_targets(repeated, period),
                ),
            }
            row["seconds"] = round(time.time() - start, 1)
            out.write(json.dumps(row) + "\n")
            print(f"measured {folder} in {row['seconds']} s")


def _range(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.3f}" if len(values) == 1 or f"{lo:.3f}" == f"{hi:.3f}" else f"{lo:.3f} to {hi:.3f}"


def print_table(kind: str, groups: dict[tuple[int, int], list[dict]]) -> None:
    """One markdown row per depth and training budget: losses, marginal nats by order and the
    first-order split by layer, each the range over the seeds."""
    deepest = max(depth for depth, _ in groups)
    header = ["depth", "tokens (M)", "seeds", "loss, direct path", "loss, model"]
    header += [f"order {n}" for n in range(1, deepest + 1)] + ["first order by layer (L0; L1; ...)"]
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for (depth, tokens), found in sorted(groups.items()):
        found = sorted(found, key=lambda r: r["seed"])
        cells = [str(depth), f"{tokens / 1e6:.3g}", ", ".join(str(r["seed"]) for r in found)]
        cells += [_range([r[kind]["loss_by_order"][i] for r in found]) for i in (0, -1)]
        marginal = [[r[kind]["marginal"][n] for r in found] for n in range(depth)]
        cells += [_range(marginal[n]) if n < depth else "" for n in range(deepest)]
        layers = [[r[kind]["first_order_by_layer"][layer] for r in found] for layer in range(depth)]
        cells.append("; ".join(_range(values) for values in layers))
        print("| " + " | ".join(cells) + " |")


def table(args: argparse.Namespace) -> None:
    rows = [json.loads(line) for file in args.files for line in Path(file).read_text().splitlines() if line]
    groups: dict[tuple[int, int], list[dict]] = defaultdict(list)
    for row in rows:
        groups[(row["layers"], row["tokens_trained"])].append(row)
    budgets = [r["tokens_trained"] for r in rows]
    # the figure: the budget asked for, else the one most models were trained with
    budget = args.budget or max(set(budgets), key=budgets.count)
    series: dict[str, list[tuple[float, float]]] = {}
    for kind in ("text", "repeated"):
        print(f"\n{rows[0][kind]['tokens'].split(' (')[0]}: marginal nats by order (range over seeds)\n")
        print_table(kind, groups)
        for (depth, tokens), found in sorted(groups.items()):
            for n in range(1, depth if tokens == budget else 0):
                mean = float(np.mean([r[kind]["marginal"][n] for r in found]))
                series.setdefault(f"{kind}: order {n + 1}", []).append((depth, mean))
    if args.figure:
        label = f"marginal nats of orders 2+ by depth, {budget / 1e6:.1f}M tokens (mean over seeds)"
        Path(args.figure).write_text(line_chart(series, "layers", "marginal nats", label=label))
        print(f"\nfigure: {args.figure} ({label})")
    print(f"\nmachine: {machine()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("train", help="train one model")
    p.add_argument("--layers", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--width", choices=sorted(RECIPES), default="cpu")
    p.add_argument("--steps", type=int, help="override the recipe's steps")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int)
    p.set_defaults(run=train_one)
    p = sub.add_parser("measure", help="term importance of trained models, one JSON line each")
    p.add_argument("checkpoints", nargs="+", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--windows", type=int, default=256, help="sequences of each kind (a multiple of 16)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int)
    p.set_defaults(run=measure)
    p = sub.add_parser("table", help="the depth x order table and the figure")
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--figure", type=Path)
    p.add_argument("--budget", type=int, help="the figure's models: those trained on this many tokens")
    p.set_defaults(run=table)
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
