"""A researcher's own data: token ids, and per-position targets, read from a file.

A model trained on an algorithmic task of its own (a sequence that starts with a start token, a
target that is not the next token, a classifier's label at the last position) is measured on that
task only on its own data; repeated random tokens or text are off its training distribution.
``qkov analyze --tokens FILE [--targets FILE]`` reads them here.

Formats (by the file's suffix), each holding ``[batch, pos]`` integer ids (one 1-D row is one
sequence):

- ``.npy``: a NumPy array (``allow_pickle=False``: no object arrays);
- ``.safetensors``: its one tensor, or its tensor named ``tokens`` (``targets`` for targets);
- ``.pt`` / ``.pth``: a tensor, a list of rows, or a dict holding one of those (as the
  safetensors file), read only through :func:`qkov.pickles.read_pickle`
  (``torch.load(weights_only=True)``, which runs no code);
- ``.jsonl``: one JSON list of ids per line (blank lines skipped).

Targets have the tokens' shape; ``-100`` marks a position without a target (PyTorch's
``ignore_index``). Without a targets file each position's target is the next token (the last
position has none). Anything that does not fit the model is refused with one line.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from jaxtyping import Int
from torch import Tensor

from qkov.config import Config
from qkov.errors import QkovError
from qkov.pickles import read_pickle
from qkov.tensorfile import read_tensor_file

IGNORE = -100  # a position without a target (PyTorch's ignore_index)
SUFFIXES = (".npy", ".safetensors", ".pt", ".pth", ".jsonl")


@dataclass(frozen=True)
class UserTokens:
    """A user's sequences and their targets (``IGNORE`` where a position has none), both
    ``[batch, pos]`` int64 on the CPU; ``description`` names the files, as the results say."""

    tokens: Int[Tensor, "batch pos"]
    targets: Int[Tensor, "batch pos"]
    description: str

    @property
    def targeted(self) -> int:
        """How many positions have a target."""
        return int((self.targets != IGNORE).sum())


def _rows(rows: list, file: Path) -> Tensor:
    """A list of rows (lists of ids, or 1-D tensors) as one ``[batch, pos]`` tensor."""
    if not rows:
        raise QkovError(f"{file}: no tokens (no rows)")
    if all(isinstance(i, int) and not isinstance(i, bool) for i in rows):  # one row of ids
        rows = [rows]
    if not all(isinstance(row, list | tuple | Tensor) for row in rows):
        kind = next(type(row).__name__ for row in rows if not isinstance(row, list | tuple | Tensor))
        raise QkovError(f"{file}: rows of token ids expected, found a {kind}")
    lengths = {len(row) for row in rows}
    if len(lengths) > 1:
        raise QkovError(
            f"{file}: ragged rows (lengths {min(lengths)} to {max(lengths)}); rows need one length"
        )
    try:
        return torch.as_tensor(np.array([np.asarray(row) for row in rows]))
    except (TypeError, ValueError) as err:
        raise QkovError(f"{file}: rows of token ids expected ({str(err).splitlines()[0]})") from None


def _jsonl(file: Path) -> Tensor:
    rows = []
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise QkovError(f"{file}: not UTF-8 text (byte {err.start}: {err.reason})") from None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise QkovError(f"{file}:{number}: not JSON ({err.msg})") from None
        except RecursionError:
            raise QkovError(f"{file}:{number}: not a list of token ids (JSON nested too deeply)") from None
        except ValueError as err:  # an integer of more than 4,300 digits
            raise QkovError(f"{file}:{number}: not JSON ({str(err).split(':')[0]})") from None
        if not isinstance(row, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in row):
            raise QkovError(f"{file}:{number}: expected a JSON list of integer token ids")
        too_large = next((i for i in row if not -(2**63) <= i < 2**63), None)
        if too_large is not None:
            raise QkovError(f"{file}:{number}: token id {too_large} does not fit in 64 bits")
        rows.append(row)
    return _rows(rows, file)


def _npy(file: Path) -> Tensor:
    """A ``.npy`` array, its header checked against the file's size before numpy allocates what
    the header says (a header can claim terabytes in a few bytes)."""
    try:
        with open(file, "rb") as f:
            version = np.lib.format.read_magic(f)
            read_header = (
                np.lib.format.read_array_header_1_0
                if version == (1, 0)
                else np.lib.format.read_array_header_2_0
            )
            shape, _, dtype = read_header(f, max_header_size=10000)
            start = f.tell()
        if dtype.hasobject:
            raise ValueError("an object array (pickled values are never read)")
        needed = math.prod(shape) * dtype.itemsize
        available = file.stat().st_size - start
        if needed != available:
            raise ValueError(
                f"its header says shape {shape} of {dtype}, {needed:,} bytes; it holds {available:,}"
            )
        array = np.load(file, allow_pickle=False)
    except (ValueError, OSError, TypeError, EOFError, SyntaxError) as err:
        raise QkovError(f"{file}: not a readable .npy array ({str(err).splitlines()[0]})") from None
    return _as_tensor(array, file)


def _as_tensor(array: np.ndarray, file: Path) -> Tensor:
    """An integer array as a tensor: unsigned ids above 2^63 - 1 (which int64 would wrap to negative
    numbers) named by their own value."""
    if array.dtype.kind == "u" and array.size and array.max() > 2**63 - 1:
        flat = int(np.argmax(array.reshape(-1) > 2**63 - 1))
        where = np.unravel_index(flat, array.shape)
        raise QkovError(
            f"{file}: token id {int(array.reshape(-1)[flat])} at index {tuple(int(i) for i in where)} "
            "does not fit in 64-bit signed integers"
        )
    if not array.dtype.isnative:  # a big-endian .npy (written on another machine): torch reads native only
        array = array.astype(array.dtype.newbyteorder("="))
    try:
        return torch.as_tensor(array)
    except TypeError as err:
        raise QkovError(f"{file}: token ids of dtype {array.dtype} ({str(err).splitlines()[0]})") from None


def _named(tensors: dict[str, Any], name: str, file: Path) -> Any:
    """The one entry of a file's dict, or the one called ``name``."""
    if len(tensors) == 1:
        return next(iter(tensors.values()))
    if name not in tensors:
        raise QkovError(f"{file}: {len(tensors)} entries and none named {name!r} (give one, or name it so)")
    return tensors[name]


def _pickled(file: Path, name: str) -> Tensor:
    held = read_pickle(file)
    if isinstance(held, dict):
        held = _named(held, name, file)
    if isinstance(held, Tensor):
        return held
    if isinstance(held, list | tuple):
        return _rows(list(held), file)
    raise QkovError(f"{file}: holds a {type(held).__name__}, not a tensor or a list of rows of token ids")


def read_ids(file: str | Path, name: str = "tokens") -> Int[Tensor, "batch pos"]:
    """The integer ids of one file, ``[batch, pos]`` int64 (``name``: the tensor to take from a
    safetensors or pickled dict of several), with one line for a file that is missing, of an
    unknown kind, unreadable, not integer, or not one or two dimensional."""
    file = Path(file)
    if not file.is_file():
        raise QkovError(f"{file}: no such file")
    suffix = file.suffix.lower()
    if suffix not in SUFFIXES:
        raise QkovError(f"{file}: unknown kind of file (expected one of {', '.join(SUFFIXES)})")
    if suffix == ".npy":
        ids = _npy(file)
    elif suffix == ".safetensors":
        ids = _named(read_tensor_file(file)[0], name, file)
    elif suffix == ".jsonl":
        ids = _jsonl(file)
    else:
        ids = _pickled(file, name)
    if ids.dtype == torch.uint64:  # int64 would wrap ids above 2^63 - 1 to negative ones
        ids = _as_tensor(ids.numpy(), file)
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise QkovError(f"{file}: token ids must be integers, got dtype {ids.dtype}")
    if ids.ndim not in (1, 2):
        raise QkovError(f"{file}: expected [batch, pos] token ids, got shape {tuple(ids.shape)}")
    ids = ids.reshape(1, -1) if ids.ndim == 1 else ids
    if not ids.numel():
        raise QkovError(f"{file}: no tokens (shape {tuple(ids.shape)})")
    return ids.long()


def _check_range(ids: Tensor, high: int, what: str, file: Path, allowed: int | None = None) -> None:
    """One line naming the first id of ``ids`` outside ``[0, high)`` (``allowed`` also passes)."""
    bad = (ids < 0) | (ids >= high)
    if allowed is not None:
        bad &= ids != allowed
    if bad.any():
        row, pos = (int(i) for i in bad.nonzero()[0])
        extra = f" or {allowed}" if allowed is not None else ""
        raise QkovError(
            f"{file}: {what} {int(ids[row, pos])} at row {row}, position {pos} is outside [0, {high}){extra}"
        )


def next_token_targets(tokens: Int[Tensor, "batch pos"]) -> Int[Tensor, "batch pos"]:
    """Each position's target is the next token; the last position has none (``IGNORE``)."""
    targets = torch.full_like(tokens, IGNORE)
    targets[:, :-1] = tokens[:, 1:]
    return targets


@dataclass(frozen=True)
class UserFiles:
    """The ``--tokens`` file's ids and the ``--targets`` file's (or None), each read and checked as a
    file (:func:`read_ids`), not yet against each other or a model."""

    tokens_file: Path
    tokens: Int[Tensor, "batch pos"]
    targets_file: Path | None
    targets: Int[Tensor, "batch pos"] | None


def read_user_files(tokens_file: str | Path | None, targets_file: str | Path | None) -> UserFiles | None:
    """The user's files read, or None without ``--tokens``: done before any model is opened, so that
    a missing or unreadable file is one line at once, not after the minutes a large model takes to
    open. Targets without tokens are refused."""
    if targets_file is not None and tokens_file is None:
        raise QkovError("--targets needs --tokens (the sequences they belong to)")
    if tokens_file is None:
        return None
    tokens_file = Path(tokens_file)
    tokens = read_ids(tokens_file, "tokens")
    if targets_file is None:
        return UserFiles(tokens_file, tokens, None, None)
    targets_file = Path(targets_file)
    return UserFiles(tokens_file, tokens, targets_file, read_ids(targets_file, "targets"))


def checked_user_tokens(files: UserFiles, cfg: Config) -> UserTokens:
    """The user's files (:func:`read_user_files`) checked against the model ``cfg``: ids in
    ``[0, d_vocab)``, rows of at most ``n_ctx``, targets of the tokens' shape in ``[0, d_vocab_out)``
    or ``-100`` (default: the next token), at least one position with a target. A model whose
    outputs are not tokens (``d_vocab_out``) needs its targets given."""
    tokens, tokens_file, targets_file = files.tokens, files.tokens_file, files.targets_file
    _check_range(tokens, cfg.d_vocab, "token id", tokens_file)
    if tokens.shape[1] > cfg.n_ctx:
        raise QkovError(
            f"{tokens_file}: rows of {tokens.shape[1]} tokens are longer than the context (n_ctx={cfg.n_ctx})"
        )
    shape = f"{tokens.shape[0]} x {tokens.shape[1]} tokens"
    if files.targets is None:
        if not cfg.outputs_tokens:
            raise QkovError(
                f"the model's {cfg.d_out} outputs are not tokens (d_vocab_out): give the targets (--targets)"
            )
        targets, said = next_token_targets(tokens), "the next token as targets"
    else:
        targets, said = files.targets, f"targets {targets_file.name}"
        if targets.shape != tokens.shape:
            raise QkovError(
                f"{targets_file}: targets of shape {tuple(targets.shape)}, tokens of {tuple(tokens.shape)}"
            )
        _check_range(targets, cfg.d_out, "target", targets_file, allowed=IGNORE)
    if not (targets != IGNORE).any():
        raise QkovError(f"{targets_file or tokens_file}: no position has a target")
    return UserTokens(tokens, targets, f"the user's tokens {tokens_file.name} ({shape}; {said})")


def read_user_tokens(tokens_file: str | Path, targets_file: str | Path | None, cfg: Config) -> UserTokens:
    """A user's tokens (and targets) read and checked against the model ``cfg``
    (:func:`read_user_files`, then :func:`checked_user_tokens`)."""
    return checked_user_tokens(read_user_files(tokens_file, targets_file), cfg)
