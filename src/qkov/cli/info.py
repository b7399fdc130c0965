"""``qkov info`` (validate a checkpoint and describe it) and ``qkov schema`` (results.json's JSON Schema)."""

from __future__ import annotations

import argparse
import sys

from qkov.cli.common import CHECKPOINT_HELP, checked_checkpoint


def add_info_parsers(sub: argparse._SubParsersAction) -> None:
    info = sub.add_parser("info", help="validate a checkpoint folder and describe it")
    info.add_argument("checkpoint", help=CHECKPOINT_HELP)
    sub.add_parser("schema", help="print the JSON Schema of results.json")


def info_command(args: argparse.Namespace) -> None:
    folder = checked_checkpoint(args.checkpoint)  # first: a mistyped path is told before torch loads
    from qkov.interop import open_model as load
    from qkov.training_log import read_training_log, row_fields

    model = load(folder)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{args.checkpoint}: {n_params:,} parameters ({model.W_E.dtype}), biases: {model.has_biases}")
    for key, value in model.cfg.to_dict().items():
        print(f"  {key}: {value}")
    size = model.tokenizer.get_vocab_size() if model.tokenizer is not None else None
    print(f"  tokenizer: {f'{size} tokens' if size else 'none'}")
    log = read_training_log(folder)
    if log:
        print("  last metrics: " + ", ".join(f"{k} {v}" for k, v in row_fields(log[-1]).items()))


def schema_command(args: argparse.Namespace) -> None:
    from qkov.results import schema_text

    sys.stdout.write(schema_text())
