"""The induction phase change across seeds, schedules and recipe changes: many training runs side by
side, each writing its ``metrics.jsonl``, for the phase-change experiment (issue 13) and the choice
of the main job's defaults (issue 16). Not a test: its figures are in the README.

Every run trains on the same token arrays (the embedded corpus' tokenizer and tokens, exported once
with ``export`` so that another machine, e.g. a GPU one, trains on exactly these tokens), from the
default recipe for its depth with the run's overrides. Runs go ``--parallel`` at a time; at
``--deadline`` seconds every unfinished run is stopped, and what its log holds so far is kept.

    python benchmarks/phase_sweep.py export .sweepdata                     # tokens for 4096 and 2048
    python benchmarks/phase_sweep.py run .sweepdata --out runs --plan phase --device cuda --parallel 12
    python benchmarks/phase_sweep.py table runs                            # onset, width, scores

A run's name is ``{plan entry}-s{seed}``; ``table`` prints, per run, the tokens at which the best
induction score first passed 10% and 90% of its rise, the width in decades, and the final scores.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from qkov.data.corpus import read_corpus
from qkov.data.tokens import TokenSplits, cached_tokenizer, cached_tokens
from qkov.recipes import recipe
from qkov.train import METRICS_FILE, Trainer

VOCABS = (4096, 2048)
SEEDS = (0, 1, 2)
# A constant-rate run keeps the same trajectory whatever its length, so its warm-up is fixed (the
# default recipe's 5% of 24,000 steps) and its step count is only where it stops.
CONSTANT = {"schedule": "constant", "warmup_steps": 1200}
PLANS: dict[str, list[tuple[str, int, dict]]] = {
    "phase": [
        ("cosine", 2, {}),
        ("constant", 2, CONSTANT | {"steps": 16000}),
        ("batch4-constant", 2, CONSTANT | {"batch_size": 4, "steps": 32000}),
        ("vocab2048-constant", 2, CONSTANT | {"vocab_size": 2048, "steps": 16000}),
        ("1layer", 1, {}),
    ],
    "smoke": [("cosine", 2, {"steps": 60, "eval_every": 30}), ("1layer", 1, {"steps": 30})],
}


def export(folder: Path) -> None:
    """The embedded corpus' tokenizer and token arrays for each vocabulary size, into ``folder``."""
    corpus = read_corpus(None)
    folder.mkdir(parents=True, exist_ok=True)
    for vocab in VOCABS:
        tokenizer = cached_tokenizer(corpus, vocab)
        data = cached_tokens(corpus, tokenizer)
        tokenizer.save(str(folder / f"tokenizer-{vocab}.json"))
        for split in ("train", "eval"):
            np.save(folder / f"tokens-{vocab}.{split}.npy", np.asarray(getattr(data, split)))
        print(f"vocabulary {vocab}: {len(data.train):,} train / {len(data.eval):,} eval tokens")


def train_one(data_dir: Path, out: Path, layers: int, seed: int, overrides: dict, device: str) -> None:
    vocab = overrides.get("vocab_size", recipe(layers).vocab_size)
    tokenizer = Tokenizer.from_file(str(data_dir / f"tokenizer-{vocab}.json"))
    data = TokenSplits(*(np.load(data_dir / f"tokens-{vocab}.{s}.npy") for s in ("train", "eval")))
    cfg, train_cfg = recipe(layers).override(seed=seed, **overrides).configs(tokenizer.get_vocab_size())
    Trainer(cfg, train_cfg, data, out, tokenizer, device).run(resume=True, show_progress=False)


def launch(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    plan = PLANS[args.plan]
    runs = [(f"{name}-s{seed}", layers, seed, o) for name, layers, o in plan for seed in args.seeds]
    started, waiting, active = time.time(), list(runs), {}
    while waiting or active:
        while waiting and len(active) < args.parallel:
            name, layers, seed, overrides = waiting.pop(0)
            command = [sys.executable, __file__, "_one", str(args.data), str(args.out / name), str(layers),
                       str(seed), json.dumps(overrides), args.device]  # fmt: skip
            env = os.environ | {"OMP_NUM_THREADS": str(args.threads)}
            active[name] = subprocess.Popen(command, env=env)
        for name, process in list(active.items()):
            if process.poll() is not None:
                print(f"{time.time() - started:6.0f} s  {name} ended ({process.returncode})", flush=True)
                del active[name]
        if time.time() - started > args.deadline:
            for name, process in active.items():
                process.kill()
                print(f"{time.time() - started:6.0f} s  {name} stopped at the deadline", flush=True)
            break
        time.sleep(2)
    table(args.out)


def crossing(rows: list[dict], fraction: float) -> float | None:
    """Tokens at which the best induction score first passed ``fraction`` of its rise."""
    start, final = rows[0]["induction_score"], rows[-1]["induction_score"]
    level = start + fraction * (final - start)
    return next((r["tokens"] for r in rows if r["induction_score"] >= level), None)


def table(folder: Path) -> None:
    heads = ("tokens", "10%", "90%", "decades", "induct", "prev", "icl")
    print(f"{'run':28} " + " ".join(f"{h:>8}" for h in heads))
    for run in sorted(p for p in folder.iterdir() if (p / METRICS_FILE).is_file()):
        rows = [json.loads(line) for line in (run / METRICS_FILE).read_text().splitlines() if line.strip()]
        rows = [r for r in rows if "induction_score" in r]
        if len(rows) < 2:
            continue
        low, high = crossing(rows, 0.1), crossing(rows, 0.9)
        last = rows[-1]
        decades = math.log10(high / low) if low and high else float("nan")
        millions = (f"{x / 1e6:7.2f}M" for x in (last["tokens"], low, high))
        scores = (decades, last["induction_score"], last["previous_token_score"], last.get("icl_score", 0))
        print(f"{run.name:28} " + " ".join([*millions, *(f"{x:8.2f}" for x in scores)]))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_one":  # one run, started by ``run``
        data, out, layers, seed, overrides, device = sys.argv[2:]
        train_one(Path(data), Path(out), int(layers), int(seed), json.loads(overrides), device)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("export").add_argument("data", type=Path)
    run = commands.add_parser("run")
    run.add_argument("data", type=Path)
    run.add_argument("--out", type=Path, required=True)
    run.add_argument("--plan", choices=sorted(PLANS), default="phase")
    run.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    run.add_argument("--device", default="cpu")
    run.add_argument("--parallel", type=int, default=1)
    run.add_argument("--threads", type=int, default=2, help="CPU threads per run")
    run.add_argument("--deadline", type=float, default=math.inf, help="seconds; unfinished runs stop then")
    commands.add_parser("table").add_argument("folder", type=Path)
    args = parser.parse_args()
    if args.command == "export":
        export(args.data)
    elif args.command == "run":
        launch(args)
    else:
        table(args.folder)


if __name__ == "__main__":
    main()
