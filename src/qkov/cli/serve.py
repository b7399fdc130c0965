"""``qkov serve``: the local explorer of one checkpoint."""

from __future__ import annotations

import argparse

from qkov.cli.analyze import add_user_data_arguments
from qkov.cli.common import CHECKPOINT_HELP, add_threads_argument, checked_checkpoint, set_threads
from qkov.errors import QkovError


def add_serve_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="explore a checkpoint's heads, texts and circuits in the browser",
        description="Serve a local web explorer of one checkpoint: type a text to see every head's "
        "attention and the logits' path expansion, pick a head to read its OV and QK circuits over the "
        "whole vocabulary, pick two heads to see how they compose; with --tokens, choose a row of your own "
        "data and see the same against its targets. Computed on demand and cached.",
    )
    p.add_argument("checkpoint", help=CHECKPOINT_HELP)
    p.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine only)"
    )
    p.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    p.add_argument("--cache-mb", type=int, default=256, help="memory for cached answers, MiB (default: 256)")
    p.add_argument("--workers", type=int, default=2, help="computations run at once (default: 2)")
    add_user_data_arguments(
        p,
        "adds a data view: every row's loss and accuracy; a row's attention patterns, predictions, "
        "loss per position and path expansion against its targets",
    )
    add_threads_argument(p)


def serve_command(args: argparse.Namespace) -> None:
    if not 1 <= args.port <= 65535:
        raise QkovError(f"--port must lie in [1, 65535], got {args.port}")
    if args.cache_mb < 1 or args.workers < 1:
        raise QkovError("--cache-mb and --workers must be at least 1")
    checked_checkpoint(args.checkpoint)  # a Hugging Face name stays the name the explorer shows
    from qkov.serve import serve

    set_threads(args.threads)
    serve(
        args.checkpoint,
        args.host,
        args.port,
        args.cache_mb,
        args.workers,
        args.tokens,
        args.targets,
    )
