"""``qkov train``: train an attention-only model (resumable; several processes with ``--nproc``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from qkov.cli.common import (
    DEVICES,
    add_corpus_argument,
    add_text_field_argument,
    common_options,
    console,
    set_threads,
)
from qkov.config import ACT_FNS, NORMALIZATIONS, POSITIONAL_EMBEDDINGS
from qkov.recipes import PRESETS


def add_train_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        parents=[common_options(f"where to train: {DEVICES}")],
        help="train an attention-only transformer on a corpus",
        description="Train an attention-only transformer. Unset options take the "
        "measured defaults for the depth (see the README).",
    )
    p.add_argument("--layers", type=int, required=True, help="number of attention layers (0, 1, 2, ...)")
    p.add_argument("--out", required=True, help="checkpoint folder to write")
    p.add_argument("--preset", choices=PRESETS, default="default", help="paper: the paper's model sizes")
    p.add_argument("--steps", type=int)
    p.add_argument("--batch-size", type=int, help="global batch size (sequences), whatever --nproc")
    p.add_argument("--lr", type=float)
    p.add_argument("--d-model", type=int)
    p.add_argument("--n-heads", type=int)
    p.add_argument("--d-head", type=int)
    p.add_argument("--n-ctx", type=int)
    p.add_argument("--vocab-size", type=int)
    p.add_argument("--positional-embedding", choices=POSITIONAL_EMBEDDINGS)
    p.add_argument("--normalization", choices=NORMALIZATIONS, help="LayerNorm (default: none)")
    p.add_argument("--d-mlp", type=int, help="MLP width after each attention layer (default 0: none)")
    p.add_argument("--act-fn", choices=ACT_FNS, help="the MLP's activation (default: gelu_new)")
    add_corpus_argument(
        p,
        "text, .jsonl(.gz/.zst) or .parquet files, folders or globs (repeatable); "
        "default: the Python standard library",
    )
    add_text_field_argument(p)
    p.add_argument("--embed-lr-mult", type=float, help="learning-rate multiplier for W_E and W_pos")
    p.add_argument(
        "--precision",
        choices=["fp32", "bf16"],
        help="bf16 autocasts matmuls to bfloat16 (default on GPUs with bf16)",
    )
    p.add_argument("--nproc", type=int, default=1, help="processes on this machine (launches torchrun)")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per process and step")
    p.add_argument(
        "--schedule", choices=["cosine", "constant"], help="after warm-up: cosine decay or a constant rate"
    )
    p.add_argument("--eval-every", type=int, help="steps between evenly spaced evaluations (metrics.jsonl)")
    p.add_argument(
        "--evals-per-decade", type=int, help="log-spaced evaluations per decade of steps (0: none)"
    )
    p.add_argument("--checkpoint-every", type=int, help="steps between checkpoints")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    p.add_argument("--compile", action="store_true", help="torch.compile the training step (measure first)")


def train_command(args: argparse.Namespace) -> None:
    from qkov.distributed import default_threads
    from qkov.io import check_writable_folder
    from qkov.training_run import TRAIN_FLAGS, TrainingInterrupted, TrainingRun, train

    check_writable_folder(args.out)
    set_threads(args.threads, default_threads(args.nproc))
    settings = {name: getattr(args, name) for name in TRAIN_FLAGS}
    run = TrainingRun(
        Path(args.out), args.layers, args.preset, settings, args.corpus, args.text_field, args.device,
        args.resume, args.grad_accum, args.compile, args.nproc, tuple(args.argv),
    )  # fmt: skip
    try:
        train(run, show_progress=not args.quiet)
    except TrainingInterrupted as stop:
        if stop.report:
            console.print(f"interrupted at step {stop.step}; checkpoint saved. Continue with --resume.")
        sys.exit(130)
