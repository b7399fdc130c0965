"""``qkov import``: another library's model in, written as a qkov checkpoint folder."""

from __future__ import annotations

import argparse
from pathlib import Path

from qkov.cli.common import console
from qkov.errors import QkovError


def add_import_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "import",
        help="import a Hugging Face GPT-2, TransformerLens or any model (by a mapping) as a qkov checkpoint",
        description="Read SRC, a folder or a weights file (model.safetensors, or a pickled .pt/.pth/.bin "
        "state dict, read only through torch.load(weights_only=True): tensors and plain containers, "
        "never code): a Hugging Face GPT-2 or a TransformerLens model (config.json from cfg.to_dict() "
        "or in the legacy keys of Neel Nanda's models) with the config.json beside it, or weights in "
        "any layout with --mapping. Fold its LayerNorm and centre its weights as TransformerLens does, "
        "and write a qkov checkpoint folder.",
    )
    p.add_argument(
        "src",
        help="the folder or weights file to import, or a model's Hugging Face name org/name[@revision] in "
        "the local cache (never downloaded)",
    )
    p.add_argument("--out", required=True, help="the qkov checkpoint folder to write")
    p.add_argument("--no-fold", action="store_true", help="keep LayerNorm as it is and change no weight")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace the checkpoint or training run already in --out (its training state, training "
        "config and metrics log are removed, so the folder holds only the imported model)",
    )
    p.add_argument("--config", help="the config.json to use (default: the one beside the weights)")
    p.add_argument(
        "--mapping", help="a JSON file mapping the weights' own keys to qkov's, with the model's config"
    )
    p.add_argument(
        "--check",
        metavar="REF",
        help="a safetensors file of tokens [batch, pos] and the source's logits [batch, pos, d_vocab]: "
        "print the largest log-probability difference; refuse the import above 1e-4 (float32 logits: "
        "1024 units in the last place of their largest log-probability, when that is more)",
    )
    p.add_argument(
        "--bos-token-id",
        type=int,
        metavar="N",
        help="the start token the model's sequences begin with in training (default: the source's, "
        "else none): the repeated-token test and corpus text then begin with it",
    )


#: What a checkpoint folder or a training run holds: ``qkov import --out`` refuses a folder holding
#: any of them unless ``--force``, and then removes those the import does not write.
RUN_FILES = ("config.json", "model.safetensors", "tokenizer.json")

TRAINING_FILES = ("train_config.json", "training_state.safetensors", "metrics.jsonl")


def check_import_folder(out: Path, force: bool) -> None:
    """``--out`` writable, and holding no checkpoint or training run unless ``force``."""
    from qkov.io import check_writable_folder

    check_writable_folder(out)
    held = [name for name in RUN_FILES + TRAINING_FILES if (out / name).exists()]
    if held and not force:
        raise QkovError(
            f"{out} already holds a checkpoint or training run ({held[0]}); choose another --out, or "
            "pass --force to replace it"
        )


def import_command(args: argparse.Namespace) -> None:
    from qkov.hub_cache import resolve_source

    if not resolve_source(args.src).exists():  # told before torch loads
        raise QkovError(f"{args.src}: no such file or folder")
    from qkov.interop import import_checkpoint

    out = Path(args.out)
    check_import_folder(out, args.force)
    model, lines = import_checkpoint(
        args.src, args.out, not args.no_fold, args.config, args.mapping, args.check, args.bos_token_id
    )
    if args.force:  # the imported model replaced the run's: its state and log no longer describe it
        for name in TRAINING_FILES + (() if model.tokenizer is not None else ("tokenizer.json",)):
            (out / name).unlink(missing_ok=True)
    for line in lines:
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    cfg = model.cfg
    mlp = f"MLP d_mlp {cfg.d_mlp} ({cfg.act_fn})" if cfg.has_mlp else "attention-only"
    console.print(
        f"imported {cfg.n_layers} layers x {cfg.n_heads} heads, d_model {cfg.d_model}, {cfg.d_vocab} tokens, "
        f"{mlp}, normalization {cfg.normalization} (from {cfg.source}) into {args.out}",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
