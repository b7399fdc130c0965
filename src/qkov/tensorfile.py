"""Safetensors files written reproducibly with a checksum of their tensors, and read back checked.

Safetensors has no checksum: flipped bytes in a weights file load as another model. qkov's writers
put the SHA-256 of the tensors (each one's name, dtype, shape and bytes, in name order) in the file's
metadata under :data:`CHECKSUM_KEY`; :func:`read_tensor_file` recomputes it and refuses, in one line,
a file whose tensors no longer match. A file without the key (written by another tool, or by an
older qkov) is read as it is.

The safetensors writer keeps the metadata in a hash map, so the same tensors and metadata give a
header whose keys come in another order run after run; :func:`write_tensors` rewrites the header
with its keys sorted (same length, in place), so identical runs write identical bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load as load_bytes
from safetensors.torch import save_file

from qkov.errors import QkovError
from qkov.io import atomic_write, check_not_lfs_pointer

CHECKSUM_KEY = "qkov_sha256"


def tensors_checksum(tensors: dict[str, torch.Tensor]) -> str:
    """The SHA-256 (hex) of every tensor's name, dtype, shape and bytes, in name order."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach()
        digest.update(json.dumps([name, str(tensor.dtype), list(tensor.shape)]).encode())
        flat = tensor.cpu().contiguous().reshape(-1)
        if flat.numel():
            digest.update(flat.view(torch.uint8).numpy().data)
    return digest.hexdigest()


def sort_header(file: Path) -> None:
    """Rewrite ``file``'s safetensors header with its keys (and its metadata's) sorted, in place:
    the same JSON, so the same length, padded with spaces as safetensors pads it."""
    with open(file, "r+b") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
        text = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
        if len(text) > length:  # cannot happen for the same content; leave the file as written
            return
        f.seek(8)
        f.write(text + b" " * (length - len(text)))


def write_tensors(
    path: str | os.PathLike, tensors: dict[str, torch.Tensor], metadata: dict | None = None
) -> None:
    """Write ``tensors`` (CPU, contiguous) and ``metadata`` (strings) to a safetensors file at
    ``path`` atomically, the tensors' checksum in the metadata and the header's keys sorted."""
    meta = dict(metadata or {}) | {CHECKSUM_KEY: tensors_checksum(tensors)}

    def write(tmp: Path) -> None:
        save_file(tensors, str(tmp), metadata=meta)
        sort_header(tmp)

    atomic_write(path, write)


def verify_checksum(tensors: dict[str, torch.Tensor], metadata: dict[str, str], source: str) -> None:
    """One :class:`QkovError` line when ``metadata`` holds a checksum the tensors do not match;
    nothing when it holds none."""
    expected = metadata.get(CHECKSUM_KEY)
    if expected is not None and tensors_checksum(tensors) != expected:
        raise QkovError(
            f"{source}: the tensors do not match the checksum written with them ({CHECKSUM_KEY} in its "
            "metadata): the file was changed or damaged after it was written"
        )


def open_tensors(file: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Every tensor and the metadata of a safetensors file, also under a path that is not UTF-8
    (which the safetensors reader cannot take: read through the open file's descriptor, or its bytes)."""
    try:
        name = str(file).encode("utf-8").decode("utf-8")
    except UnicodeEncodeError:
        name = None
    if name is None and Path("/proc/self/fd").is_dir():
        fd = os.open(file, os.O_RDONLY)
        try:
            return open_tensors(Path(f"/proc/self/fd/{fd}"))
        finally:
            os.close(fd)
    if name is None:
        data = file.read_bytes()
        (length,) = struct.unpack("<Q", data[:8])
        return load_bytes(data), json.loads(data[8 : 8 + length]).get("__metadata__") or {}
    with safe_open(name, framework="pt") as f:
        return {key: f.get_tensor(key) for key in f.keys()}, f.metadata() or {}  # noqa: SIM118


def read_tensor_file(file: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Every tensor of a safetensors file and its metadata, with one clear line if the file is
    missing, truncated or corrupt, or its tensors do not match their checksum."""
    file = Path(file)
    if not file.is_file():
        raise QkovError(f"{file}: missing")
    try:
        tensors, metadata = open_tensors(file)
    except (SafetensorError, OSError, RuntimeError, ValueError, struct.error) as err:
        check_not_lfs_pointer(file)
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise QkovError(f"{file}: truncated or corrupt safetensors file ({reason})") from None
    verify_checksum(tensors, metadata, str(file))
    return tensors, metadata
