"""The induction phase change across seeds, schedules and recipe changes: many training runs side by
side, each writing its ``metrics.jsonl``, for the phase-change experiment and the choice
of the main job's defaults. Not a test: its figures are in docs/experiments.md.

Every run trains on the same token arrays (the embedded corpus' tokenizer and tokens, exported once
with ``export`` so that another machine, e.g. a GPU one, trains on exactly these tokens), from the
default recipe for its depth with the run's overrides. Runs go ``--parallel`` at a time; at
``--deadline`` seconds every unfinished run is stopped, and what its log holds so far is kept.

    python benchmarks/phase_sweep.py export .sweepdata                     # tokens for 4096 and 2048
    python benchmarks/phase_sweep.py run .sweepdata --out runs --plan phase --device cuda --parallel 12
    python benchmarks/phase_sweep.py table runs                            # onset, width, scores
    python benchmarks/phase_sweep.py run .sweepdata --out runs1024 --plan ctx1024  # the paper's context
    python benchmarks/phase_sweep.py icl-noise runs1024/ctx1024-2layer-s0 .sweepdata  # the score's precision
    python benchmarks/phase_sweep.py icl-noise RUN .sweepdata --stride 64 --control CONTROL_RUN

A run's name is ``{plan entry}-s{seed}``; ``table`` judges each 2-layer run by the phase-change rule
(:mod:`qkov.circuits.phase_change`, with the 1-layer run of its seed as control) and prints the
window, its width in decades, the signatures inside it and the last evaluation's scores.
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

import qkov
from qkov.circuits.phase_change import phase_change
from qkov.data.shards import sampled_tokenizer, sharded_tokens
from qkov.data.sources import CorpusFiles
from qkov.data.tokens import TokenSplits
from qkov.evaluation import icl_positions
from qkov.io import atomic_write_text
from qkov.loss import token_losses
from qkov.recipes import recipe
from qkov.report.svg import line_chart
from qkov.train import Trainer
from qkov.training_log import METRICS_FILE, read_training_log

VOCABS = (4096, 2048)
SEEDS = (0, 1, 2)
# Contiguous blocks of held-out windows whose means give the ICL score's standard error.
BLOCKS = 20
# A constant-rate run keeps the same trajectory whatever its length, so its warm-up is fixed (the
# default recipe's 5% of 24,000 steps) and its step count is only where it stops.
CONSTANT = {"schedule": "constant", "warmup_steps": 1200}
# The paper's context: Olsson et al.'s in-context-learning score is the loss at token 500 minus the
# loss at token 50 of 1024 (``qkov.evaluation.icl_positions``). One sequence of 1024 tokens a step
# keeps the default recipe's 1024 tokens a step; four times the held-out tokens (127 windows) keep
# the 1-layer control's score out of the noise that 31 windows leave it in.
CTX1024 = {"n_ctx": 1024, "batch_size": 1, "eval_tokens": 4 * 32768}
PLANS: dict[str, list[tuple[str, int, dict]]] = {
    "phase": [
        ("cosine", 2, {}),
        ("constant", 2, CONSTANT | {"steps": 16000}),
        ("batch4-constant", 2, CONSTANT | {"batch_size": 4, "steps": 32000}),
        ("vocab2048-constant", 2, CONSTANT | {"vocab_size": 2048, "steps": 16000}),
        ("1layer", 1, {}),
    ],
    "vocab2048": [
        ("vocab2048-constant-24k", 2, CONSTANT | {"vocab_size": 2048}),
        ("vocab2048-constant-lr1e-2", 2, CONSTANT | {"vocab_size": 2048, "lr": 1e-2, "steps": 16000}),
        ("vocab2048-cosine-14k", 2, {"vocab_size": 2048, "steps": 14000}),
        ("vocab2048-1layer", 1, {"vocab_size": 2048}),
    ],
    # The control trained as long as the 2-layer model, on the same schedule (the 1-layer recipe's
    # 1500 steps would cover only its first decade of tokens).
    "ctx1024": [
        ("ctx1024-2layer", 2, CTX1024),
        ("ctx1024-1layer", 1, CTX1024 | CONSTANT | {"steps": 14000, "eval_every": 2000}),
    ],
    "smoke": [("cosine", 2, {"steps": 60, "eval_every": 30}), ("1layer", 1, {"steps": 30})],
}


def export(folder: Path) -> None:
    """The embedded corpus' tokenizer and token arrays for each vocabulary size, into ``folder``."""
    corpus = CorpusFiles.find(None)
    folder.mkdir(parents=True, exist_ok=True)
    for vocab in VOCABS:
        tokenizer = sampled_tokenizer(corpus, vocab)
        data = sharded_tokens(corpus, tokenizer)
        tokenizer.save(str(folder / f"tokenizer-{vocab}.json"))
        for split in ("train", "eval"):
            tokens = getattr(data, split)
            np.save(folder / f"tokens-{vocab}.{split}.npy", tokens[0 : len(tokens)])
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
    # Seed by seed, so that a deadline leaves whole seeds (a 2-layer run with its control) finished.
    runs = [(f"{name}-s{seed}", layers, seed, o) for seed in args.seeds for name, layers, o in plan]
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


def control_for(run: Path) -> Path | None:
    """The 1-layer run of the same seed (and vocabulary) as a 2-layer run: its phase-change control."""
    if "-s" not in run.name:
        return None
    name, seed = run.name.rsplit("-s", 1)
    plan = next((p for p in ("vocab2048-", "ctx1024-") if name.startswith(p)), "")
    control = run.parent / f"{plan}1layer-s{seed}"
    return control if (control / METRICS_FILE).is_file() else None


def table(folder: Path) -> None:
    """Each 2-layer run judged by :func:`qkov.circuits.phase_change.phase_change`, with the 1-layer
    run of its seed as control; the tokens at which the window opens and closes, its width, the
    last evaluation's scores, the control test's verdict and margin (nats), the signatures that
    hold and the verdict."""
    heads = ("tokens", "window", "", "decades", "ICL in", "induct", "prev", "ICL", "control", "signatures")
    print(f"{'run':28} " + " ".join(f"{h:>8}" for h in heads))
    for run in sorted(p for p in folder.iterdir() if (p / METRICS_FILE).is_file()):
        log = read_training_log(run)
        control = control_for(run)
        change = phase_change(log, read_training_log(control) if control else None)
        if json.loads((run / "config.json").read_text())["n_layers"] < 2:
            continue
        last = log[-1]
        if change is None:  # the induction score never rose: no window to judge
            scores = (last.induction_score, last.previous_token_score, last.icl_score)
            cells = [f"{last.tokens / 1e6:7.2f}M", *(f"{'-':>8}" for _ in range(4))]
            cells += [f"{x:8.2f}" for x in scores]
            print(f"{run.name:28} " + " ".join(cells), "    -  no rise of the induction score")
            continue
        c = change.control
        ends = (last.tokens, change.window_start_tokens, change.window_end_tokens)
        cells = [
            *(f"{x / 1e6:7.2f}M" for x in ends),
            f"{change.window_decades:8.2f}",
            f"{change.icl_change:8.0%}" if change.icl_change is not None else f"{'-':>8}",
            *(f"{x:8.2f}" for x in (last.induction_score, last.previous_token_score, last.icl_score)),
            f"{c.verdict:>13} {c.margin if c.margin is not None else float('nan'):+.2f}"
            if c
            else f"{'-':>8}",
            ",".join(change.signatures) + f" -> {change.verdict}",
        ]
        print(f"{run.name:28} " + " ".join(cells))


def figures(folder: Path, stem: Path) -> None:
    """The induction score and the ICL score of every run in ``folder`` against tokens seen (log
    scale), as ``{stem}-induction.svg`` and ``{stem}-icl.svg``."""
    runs = sorted(run for run in folder.iterdir() if (run / METRICS_FILE).is_file())
    logs = {run.name: read_training_log(run) for run in runs}
    for field, title in (("induction_score", "induction score"), ("icl_score", "ICL score (nats)")):
        series = {name: [(p.tokens, getattr(p, field)) for p in log] for name, log in logs.items()}
        label = f"{title} during training, {folder.name}"
        chart = line_chart(series, "tokens seen", title, label=label, log_x=True)
        path = stem.with_name(f"{stem.name}-{field.split('_')[0]}.svg")
        atomic_write_text(path, chart)
        print(f"figure: {path}")


def window_scores(run: Path, data: Path, stride: int | None) -> tuple[torch.Tensor, tuple[int, int]]:
    """A run's in-context-learning score (``qkov.evaluation.icl_positions``: loss at the late
    position minus the early one) on each held-out window of ``n_ctx + 1`` tokens, the windows
    starting every ``stride`` tokens (disjoint by default); and the two positions."""
    model = qkov.load(run).requires_grad_(False)
    vocab, (early, late) = model.cfg.d_vocab, icl_positions(model.cfg.n_ctx)
    held_out = torch.from_numpy(np.load(data / f"tokens-{vocab}.eval.npy").astype(np.int64))
    length = model.cfg.n_ctx + 1
    windows = held_out.unfold(0, length, stride or length)
    with torch.no_grad():
        losses = torch.cat([token_losses(model(w[:, :-1]), w[:, 1:]) for w in windows.split(16)])
    return (losses[:, late] - losses[:, early]).double(), (early, late)


def block_error(scores: torch.Tensor) -> float:
    """The standard error of ``scores``' mean from the means of ``BLOCKS`` contiguous blocks (batch
    means): it holds when neighbouring windows overlap, and are so not independent."""
    blocks = scores[: len(scores) // BLOCKS * BLOCKS].view(BLOCKS, -1).mean(1)
    return float(blocks.std()) / BLOCKS**0.5


def icl_noise(run: Path, data: Path, stride: int | None, control: Path | None) -> None:
    """How precisely the held-out split measures a run's in-context-learning score: the score on
    every held-out window (:func:`window_scores`), its spread between windows, and its standard error
    at the run's own number of evaluation windows, at every window the split holds as if they were
    independent, and from contiguous blocks (:func:`block_error`, which holds for overlapping windows
    too). With ``control``, also the run's score minus the control's, window by window: both read the
    same tokens, so which tokens were drawn cancels out of the difference."""
    scores, (early, late) = window_scores(run, data, stride)
    n_ctx = json.loads((run / "config.json").read_text())["n_ctx"]
    # as qkov.evaluation.evaluation_inputs draws them: whole windows of n_ctx + 1 tokens
    used = json.loads((run / "train_config.json").read_text())["eval_tokens"] // (n_ctx + 1)
    spread = float(scores.std())
    print(f"{run.name}: ICL score (loss[{late}] - loss[{early}]) on {len(scores)} held-out windows"
          f"{f' {stride} tokens apart' if stride else ''} {float(scores.mean()):+.3f}, spread {spread:.2f} "
          f"nats between windows; standard error {spread / used**0.5:.3f} at the run's {used} windows, "
          f"{spread / len(scores) ** 0.5:.3f} at all {len(scores)} if independent, "
          f"{block_error(scores):.3f} from {BLOCKS} contiguous blocks")  # fmt: skip
    if control is not None:
        difference = scores - window_scores(control, data, stride)[0]
        print(f"  minus {control.name}'s on the same windows: {float(difference.mean()):+.3f}, "
              f"standard error {block_error(difference):.3f} from {BLOCKS} contiguous blocks")  # fmt: skip


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
    tables = commands.add_parser("table")
    tables.add_argument("folder", type=Path)
    tables.add_argument("--figures", type=Path, help="also write STEM-induction.svg and STEM-icl.svg")
    noise = commands.add_parser("icl-noise")
    noise.add_argument("run", type=Path)
    noise.add_argument("data", type=Path)
    noise.add_argument("--stride", type=int, help="tokens between window starts (default: disjoint windows)")
    noise.add_argument("--control", type=Path, help="a run whose score to subtract, window by window")
    args = parser.parse_args()
    if args.command == "export":
        export(args.data)
    elif args.command == "run":
        launch(args)
    elif args.command == "icl-noise":
        icl_noise(args.run, args.data, args.stride, args.control)
    else:
        table(args.folder)
        if args.figures:
            figures(args.folder, args.figures)


if __name__ == "__main__":
    main()
