"""Safetensors files written reproducibly with a checksum of their tensors, and read back checked.

Safetensors has no checksum: flipped bytes in a weights file load as another model. qkov's writers
put the SHA-256 of the tensors (each one's name, dtype, shape and bytes, in name order) in the file's
metadata under :data:`CHECKSUM_KEY`; :func:`read_tensor_file` recomputes it and refuses, in one line,
a file whose tensors no longer match. A file without the key (written by another tool, or by an
older qkov) is read as it is.

:func:`map_tensor_file` reads a file lazily instead: its header is parsed and checked (every
tensor's dtype, shape and byte range, the ranges tiling the data exactly, the file's length), and
each tensor is a :class:`MappedTensor`, brought in by :meth:`MappedTensor.read` as a zero-copy,
memory-mapped view of its own bytes (unmapped once the view is dropped, so that what a reader has
touched does not stay resident). The checksum, one hash over every tensor, is verified at open by
streaming the tensors one at a time.

The safetensors writer keeps the metadata in a hash map, so the same tensors and metadata give a
header whose keys come in another order run after run; :func:`write_tensors` rewrites the header
with its keys sorted (same length, in place), so identical runs write identical bytes.
"""

from __future__ import annotations

import hashlib
import json
import math
import mmap
import os
import struct
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load as load_bytes
from safetensors.torch import save_file

from qkov.errors import QkovError
from qkov.io import atomic_write, check_not_lfs_pointer

CHECKSUM_KEY = "qkov_sha256"


def tensors_checksum(tensors: dict[str, torch.Tensor]) -> str:
    """The SHA-256 (hex) of every tensor's name, dtype, shape and bytes, in name order."""
    return _digest((name, tensors[name]) for name in sorted(tensors))


def _digest(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    """:func:`tensors_checksum` of tensors given one at a time, in name order."""
    digest = hashlib.sha256()
    for name, tensor in named:
        tensor = tensor.detach()
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
        raise checksum_error(source)


def checksum_error(source: str) -> QkovError:
    return QkovError(
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


def corrupt(file: Path, err: Exception) -> QkovError:
    """The one line for a safetensors file that cannot be read (a git-lfs pointer named as such)."""
    check_not_lfs_pointer(file)
    reason = str(err).splitlines()[0] if str(err) else type(err).__name__
    return QkovError(f"{file}: truncated or corrupt safetensors file ({reason})")


def read_tensor_file(file: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Every tensor of a safetensors file and its metadata, with one clear line if the file is
    missing, truncated or corrupt, or its tensors do not match their checksum."""
    file = Path(file)
    if not file.is_file():
        raise QkovError(f"{file}: missing")
    try:
        tensors, metadata = open_tensors(file)
    except (SafetensorError, OSError, RuntimeError, ValueError, struct.error) as err:
        raise corrupt(file, err) from None
    verify_checksum(tensors, metadata, str(file))
    return tensors, metadata


SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "I64": torch.int64, "I32": torch.int32,
    "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
}  # fmt: skip
MAX_HEADER = 100_000_000  # safetensors' own limit on the header's length


@dataclass(frozen=True)
class MappedTensor:
    """One tensor of a safetensors file, not read yet: its dtype, shape and byte range in the file."""

    file: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int
    nbytes: int

    def read(self) -> torch.Tensor:
        """The tensor, a zero-copy view of its bytes mapped copy-on-write (writes stay in memory);
        the mapping lives as long as the view (and what views it). One line when the file has been
        cut short since it was opened (reading past its end would crash the process)."""
        if not self.nbytes:
            return torch.empty(self.shape, dtype=self.dtype)
        try:
            if self.file.stat().st_size < self.start + self.nbytes:
                raise OSError("shorter than when it was opened")
            raw = np.memmap(self.file, dtype=np.uint8, mode="c", offset=self.start, shape=(self.nbytes,))
        except (OSError, ValueError) as err:
            raise QkovError(f"{self.file}: cannot read its tensors any more ({err})") from None
        first = raw.ctypes.data  # its entry leaves with it (unless another mapping took the address)
        _MAPPINGS[first] = weakref.ref(raw, lambda ref: _MAPPINGS.get(first) is ref and _MAPPINGS.pop(first))
        return torch.from_numpy(raw).view(self.dtype).reshape(self.shape)

    def meta(self) -> torch.Tensor:
        """A tensor of the same dtype and shape without data (PyTorch's meta device)."""
        return torch.empty(self.shape, dtype=self.dtype, device="meta")


_MAPPINGS: dict[int, weakref.ref] = {}  # a mapped tensor's first byte -> its mapping, while it lives


def page_out(view: torch.Tensor) -> None:
    """Give back the pages of a mapped file that ``view`` (of a tensor :meth:`MappedTensor.read`
    gave) spans, whole pages only: they stop counting in the process's memory and are read from the
    file again if touched (the mapping is copy-on-write and never written: nothing is lost). Nothing
    for a tensor that is no such view. A pass over a mapped 2 GiB embedding, a block of rows at a
    time, then holds a block of its pages, not all of them."""
    base = view.untyped_storage().data_ptr()
    raw = _MAPPINGS.get(base, lambda: None)()
    if raw is None or not view.numel():
        return
    span = sum((size - 1) * stride for size, stride in zip(view.shape, view.stride(), strict=True)) + 1
    lead = raw.offset % mmap.ALLOCATIONGRANULARITY  # np.memmap maps from an aligned offset before it
    first = lead + view.data_ptr() - base
    start = -(-first // mmap.PAGESIZE) * mmap.PAGESIZE
    stop = (first + span * view.element_size()) // mmap.PAGESIZE * mmap.PAGESIZE
    if stop > start:
        raw._mmap.madvise(mmap.MADV_DONTNEED, start, stop - start)


def map_tensor_file(file: str | os.PathLike) -> tuple[dict[str, MappedTensor], dict[str, str]]:
    """Every tensor of a safetensors file as a :class:`MappedTensor`, and the metadata: the header
    checked as safetensors checks it, and the tensors against their checksum when the file has one
    (streamed, one tensor mapped at a time); one line for a file missing, truncated or corrupt."""
    file = Path(file)
    if not file.is_file():
        raise QkovError(f"{file}: missing")
    try:
        tensors, metadata = _mapped_header(file)
    except (OSError, ValueError, TypeError, KeyError, struct.error) as err:
        raise corrupt(file, err) from None
    expected = metadata.get(CHECKSUM_KEY)
    if expected is not None and _digest((n, tensors[n].read()) for n in sorted(tensors)) != expected:
        raise checksum_error(str(file))
    return tensors, metadata


def _mapped_header(file: Path) -> tuple[dict[str, MappedTensor], dict[str, str]]:
    """The header's tensors and metadata; ValueError (or a JSON, key or type error) for anything
    safetensors would refuse."""
    size = file.stat().st_size
    with open(file, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        if length > MAX_HEADER or 8 + length > size:
            raise ValueError("header too large, or the file is cut short")
        header = json.loads(f.read(length))
    if not isinstance(header, dict):
        raise ValueError("the header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ValueError("__metadata__ is not a map of strings")
    tensors, end = {}, 0
    for name, entry in sorted(header.items(), key=lambda item: item[1]["data_offsets"]):
        if entry.get("dtype") not in SAFETENSORS_DTYPES:
            raise ValueError(f"tensor {name}: unknown dtype {entry.get('dtype')!r}")
        dtype, shape, (begin, stop) = (
            SAFETENSORS_DTYPES[entry["dtype"]],
            entry["shape"],
            entry["data_offsets"],
        )
        if not all(isinstance(n, int) and n >= 0 for n in [*shape, begin, stop]):
            raise ValueError(f"tensor {name}: shape and offsets must be non-negative integers")
        if begin != end or stop - begin != math.prod(shape) * dtype.itemsize:
            raise ValueError(f"tensor {name}: its bytes do not follow the previous tensor's or fit its shape")
        tensors[name], end = MappedTensor(file, dtype, tuple(shape), 8 + length + begin, stop - begin), stop
    if 8 + length + end != size:
        raise ValueError(f"the tensors need {end} bytes of data, the file holds {size - 8 - length}")
    return tensors, metadata
