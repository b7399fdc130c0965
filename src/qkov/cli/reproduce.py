"""``qkov reproduce``: the paper end to end, with a verdict per claim."""

from __future__ import annotations

import argparse
import sys

from qkov.cli.analyze import summary_lines
from qkov.cli.common import DEVICES, add_corpus_argument, common_options, console, set_threads


def add_reproduce_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "reproduce",
        parents=[common_options(f"where to train and analyse: {DEVICES}")],
        help="train 0/1/2-layer models, analyse them, check the paper's claims, write a report",
        description="Train the 0-, 1- and 2-layer models with the measured defaults (reusing finished "
        "and resuming interrupted runs in DIR), analyse each, and write DIR/results.json and "
        "DIR/report.html.",
    )
    p.add_argument("--out", default="runs/reproduce", help="output folder (default: runs/reproduce)")
    add_corpus_argument(p, "text files, folders or globs (repeatable); default: the Python standard library")
    p.add_argument("--quick", action="store_true", help="tiny models, few steps: exercises every code path")


def reproduce_command(args: argparse.Namespace) -> None:
    from qkov.claims import summary_table
    from qkov.io import check_writable_folder
    from qkov.reproduce import reproduce

    set_threads(args.threads)
    out = check_writable_folder(args.out)
    try:
        results = reproduce(out, args.corpus, args.quick, args.seed, not args.quiet, args.device)
    except KeyboardInterrupt:
        console.print("interrupted; the checkpoint is saved. Rerun the same command to resume.")
        sys.exit(130)
    for model_results in results.models.values():
        print("\n".join(summary_lines(model_results)))
    print(summary_table(results.claims))
    minutes = results.total_s / 60
    print(f"total {minutes:.1f} min; wrote {out / 'results.json'} and {out / 'report.html'}")
