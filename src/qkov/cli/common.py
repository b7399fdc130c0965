"""What every command shares: the parser whose errors are one line, the common options, thread
settings, and the checks made on a checkpoint before its weights are read.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from rich.console import Console

from qkov.errors import QkovError

if TYPE_CHECKING:
    import torch


console = Console(stderr=True)


def one_line(message: str) -> str:
    """``message`` with every character that is not printable (a newline or carriage return in a
    file's field name, say) escaped, so the error stays one line."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in message)


class Parser(argparse.ArgumentParser):
    """argparse's parser whose errors are one line and exit status 2, as every other bad input
    (argparse prints its usage first; ``--help`` still shows it)."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("qkov").strip()
        where = f"{command}: " if command else ""
        print(f"qkov: error: {one_line(where + message)} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def add_corpus_argument(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("--corpus", action="append", metavar="PATH", help=help)


def add_text_field_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--text-field", default="text", help="the text's field in .jsonl and column in .parquet")


def add_threads_argument(p: argparse.ArgumentParser, help: str = "CPU threads (default: all cores)") -> None:
    p.add_argument("--threads", type=int, help=help)


def common_options(device_help: str) -> argparse.ArgumentParser:
    """The options every long-running command shares: ``--seed``, ``--threads``, ``--quiet`` and
    ``--device`` (its help says what the command computes there)."""
    p = Parser(add_help=False)
    p.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    add_threads_argument(p, "CPU threads (default: all cores; for train, per process)")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.add_argument("--device", default="cpu", help=device_help)
    return p


DEVICES = "cpu (default), cuda, cuda:1, ..."

CHECKPOINT_HELP = (
    "checkpoint folder (config.json, model.safetensors, [tokenizer.json]), or a model's Hugging Face name "
    "org/name[@revision], read from the local cache (never downloaded)"
)


def most_threads() -> int:
    """The most CPU threads a command takes: 8 per core (more only slows a CPU down)."""
    return 8 * (os.cpu_count() or 1)


def set_threads(threads: int | None, default: int | None = None) -> None:
    """``--threads``: at least 1 and at most :func:`most_threads` when given (else ``default``, else
    every core); ten million threads crashed the process (a segmentation fault in OpenMP)."""
    if threads is not None and not 1 <= threads <= most_threads():
        raise QkovError(f"--threads must lie in [1, {most_threads()}] on this machine, got {threads}")
    import torch  # here, not at the top: the command line answers before torch loads

    torch.set_num_threads(threads or default or os.cpu_count() or 1)


def checked_checkpoint(path: str) -> Path:
    """A checkpoint folder's config checked before its weights are read: the sizes it implies
    (:func:`qkov.sizes.check_model_size`) and a ``tokenizer.json`` that is a link to nowhere (a
    loop, or a missing file), which would otherwise be silently taken for none. A Hugging Face name
    that is no existing path is its folder in the local cache (:func:`qkov.hub_cache.resolve_source`)."""
    from qkov.hub_cache import resolve_source
    from qkov.io import checkpoint_folder

    folder = checkpoint_folder(resolve_source(path))  # a mistyped path is told before torch loads
    from qkov.checkpoint import TOKENIZER_FILE, load_config
    from qkov.sizes import check_model_size

    foreign = folder.is_dir() and _is_foreign(folder)  # a Hugging Face or TransformerLens folder
    cfg = load_config(folder) if folder.is_dir() and not foreign else None
    if cfg is not None:
        check_model_size(cfg, str(folder / "config.json"))
    tokenizer = folder / TOKENIZER_FILE
    if tokenizer.is_symlink() and not tokenizer.exists():
        raise QkovError(f"{tokenizer}: a link that leads to no file (a loop, or its target is missing)")
    return folder


def _is_foreign(folder: Path) -> bool:
    """Whether a folder's config is another library's (imported in memory, its sizes checked as
    its tensors are built), not a qkov checkpoint's."""
    from qkov.io import read_json

    file = folder / "config.json"
    data = read_json(file) if file.is_file() else None
    return isinstance(data, dict) and "positional_embedding" not in data and bool(data)


def checked_weights(model: torch.nn.Module, source: str) -> torch.nn.Module:
    """``model``, once no weight is so large that the analyses' products would overflow."""
    from qkov.sizes import check_weight_magnitudes

    check_weight_magnitudes(dict(model.named_parameters()), str(source))
    return model
