"""The code before against this code in one run (``--old``), in an order a drifting machine cannot
favour (``--abba``)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--old DIR`` and ``--abba``, the same in every script that compares two codes."""
    parser.add_argument(
        "--old", type=Path, help="a worktree of the code to compare with, run first on the same model"
    )
    parser.add_argument("--abba", action="store_true", help="with --old: run old, new, new, old")


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """One usage line and exit status 2 for an ``--old`` that is not a worktree of qkov, or an
    ``--abba`` without ``--old``: decided before the model is written."""
    if args.old is not None and not (args.old / "src" / "qkov").is_dir():
        parser.error(f"--old {args.old}: not a worktree of qkov (no src/qkov in it)")
    if args.abba and args.old is None:
        parser.error("--abba orders the runs of --old and the new code: give --old too")


def run_order(old: T, new: T, abba: bool) -> list[tuple[str, T]]:
    """``old`` then ``new``, named; with ``abba``, old, new, new, old. A machine that speeds up or
    slows down through the runs then weighs on both codes alike: on 2026-12-07, whichever code ran
    second gained 2-8% in the pairs run both ways, and unchanged steps took 1.34x in second place in
    another pair (benchmarks/README.md)."""
    pair = [("old", old), ("new", new)]
    return pair + pair[::-1] if abba else pair


def ratio_line(walls: dict[str, Sequence[float]]) -> str:
    """The new / old wall time of the totals, and of each pair when there are two (new second,
    then new first)."""
    line = f"  new / old wall time: {sum(walls['new']) / sum(walls['old']):.2f}x"
    if len(walls["new"]) > 1:
        pairs = zip(walls["new"], walls["old"], strict=True)
        line += " (new second, then first: " + ", ".join(f"{n / o:.2f}x" for n, o in pairs) + ")"
    return line
