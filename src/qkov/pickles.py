"""Pickled PyTorch state dicts (``.pt``, ``.pth``, ``.bin``), read safely.

A pickle is a program: unpickling one with Python's ``pickle`` can run any code it names. qkov
reads these files only through ``torch.load(weights_only=True)``, PyTorch's restricted unpickler,
which builds tensors, storages and plain containers (dict, list, tuple, str, numbers) and refuses
every other global, so a file whose payload would call a function is refused before anything runs.

That unpickler had bypasses: CVE-2025-32434 (code execution with ``weights_only=True``, fixed in
torch 2.6, the version Hugging Face transformers' ``check_torch_load_is_safe`` requires) and
CVE-2026-24747 (GHSA-63cw-57p8-fm3p, memory corruption in the same unpickler, fixed in 2.10).
qkov refuses to read a pickle on an older torch, in one line; safetensors files need no such check.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.torch_version import TorchVersion

from qkov.errors import QkovError
from qkov.io import check_not_lfs_pointer

PICKLE_SUFFIXES = (".pt", ".pth", ".bin")
SAFE_TORCH = (2, 10)  # the first torch without a known weights_only bypass (see the module docstring)


def check_torch_for_pickles(file: Path) -> None:
    """One line when this torch has a known ``weights_only`` bypass."""
    if TorchVersion(torch.__version__) < SAFE_TORCH:
        raise QkovError(
            f"{file}: reading a pickle needs torch >= {'.'.join(map(str, SAFE_TORCH))} (older versions "
            f"have known torch.load(weights_only=True) bypasses, CVE-2025-32434 and CVE-2026-24747); "
            f"this is torch {torch.__version__}: upgrade it, or convert the file to safetensors"
        )


def refusal(file: Path, err: pickle.UnpicklingError) -> QkovError:
    """The one line for a pickle the restricted unpickler refused: what it would have called, when
    it names a global (torch's own message is several lines of advice to load it unsafely)."""
    lines = [line.strip() for line in str(err).splitlines()]
    reason = next((line for line in lines if line.startswith("WeightsUnpickler error:")), lines[0])
    reason = reason.removeprefix("WeightsUnpickler error:").strip()
    # torch words it "Unsupported global: GLOBAL x.f ..." or "... unsupported GLOBAL x.f whose module ..."
    named = next((line for line in lines if "GLOBAL " in line), None)
    if named is not None:
        called = named.split("GLOBAL ", 1)[-1].split(" ", 1)[0]
        return QkovError(
            f"{file}: refused: the pickle would call {called}, which is not a tensor or a plain "
            "container (torch.load(weights_only=True) allows only those); nothing was run"
        )
    return QkovError(f"{file}: not a readable PyTorch pickle ({reason.split('. ')[0]})")


def read_pickle(file: Path) -> Any:
    """What a pickled file holds (tensors, on the CPU, and plain containers only), with one line
    for a torch that is too old, a payload that would run code or a corrupt file."""
    check_torch_for_pickles(file)
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except Exception as err:  # the restricted unpickler fails on a damaged file in many ways (IndexError...)
        check_not_lfs_pointer(file)
        if isinstance(err, pickle.UnpicklingError):
            raise refusal(file, err) from None
        reason = str(err).splitlines()[0].split(". ")[0] if str(err) else type(err).__name__
        raise QkovError(f"{file}: not a readable PyTorch pickle ({reason})") from None


def read_pickled_tensors(file: Path) -> dict[str, Tensor]:
    """The state dict (a dict of tensors) of a pickled file, on the CPU, with one line for a torch
    that is too old, a payload that would run code, a corrupt file or anything but a state dict."""
    state = read_pickle(file)
    if not isinstance(state, dict):
        raise QkovError(f"{file}: holds a {type(state).__name__}, not a state dict (a dict of tensors)")
    for name, value in state.items():
        if not isinstance(name, str) or not isinstance(value, Tensor):
            raise QkovError(
                f"{file}: not a state dict: entry {name!r} holds a {type(value).__name__}, not a tensor "
                "(save model.state_dict() itself)"
            )
    return dict(state)
