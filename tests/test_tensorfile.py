"""Checksummed, reproducible safetensors files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from qkov.errors import QkovError
from qkov.tensorfile import CHECKSUM_KEY, read_tensor_file, tensors_checksum, write_tensors

TENSORS = {
    "b": torch.arange(12, dtype=torch.float32).reshape(3, 4),
    "a": torch.ones(5, dtype=torch.bfloat16),
    "c": torch.zeros(0, 2),
}


def test_a_written_file_reads_back_checked_and_is_the_same_bytes_each_time(tmp_path):
    meta = {f"key{i}": str(i) for i in range(20)}  # a map the writer orders differently each run
    write_tensors(tmp_path / "x.safetensors", TENSORS, meta)
    write_tensors(tmp_path / "y.safetensors", dict(reversed(TENSORS.items())), dict(reversed(meta.items())))
    assert (tmp_path / "x.safetensors").read_bytes() == (tmp_path / "y.safetensors").read_bytes()
    tensors, metadata = read_tensor_file(tmp_path / "x.safetensors")
    assert metadata[CHECKSUM_KEY] == tensors_checksum(TENSORS) and metadata["key3"] == "3"
    assert all(torch.equal(tensors[n], TENSORS[n]) for n in TENSORS)
    assert load_file(str(tmp_path / "x.safetensors")).keys() == TENSORS.keys()  # still plain safetensors


def test_flipped_bytes_are_caught_and_a_file_without_a_checksum_is_read(tmp_path):
    file = tmp_path / "x.safetensors"
    write_tensors(file, TENSORS)
    data = bytearray(file.read_bytes())
    data[-10] ^= 1
    file.write_bytes(bytes(data))
    with pytest.raises(QkovError, match="do not match the checksum") as info:
        read_tensor_file(file)
    assert "\n" not in str(info.value)
    save_file(TENSORS, str(tmp_path / "plain.safetensors"))
    assert read_tensor_file(tmp_path / "plain.safetensors")[1] == {}


def test_the_checksum_sees_names_shapes_and_dtypes():
    base = tensors_checksum({"w": torch.zeros(2, 3)})
    assert base != tensors_checksum({"v": torch.zeros(2, 3)})
    assert base != tensors_checksum({"w": torch.zeros(3, 2)})
    assert base != tensors_checksum({"w": torch.zeros(2, 3, dtype=torch.int32)})


def test_a_path_that_is_not_utf8_reads_back(tmp_path):
    folder = os.fsdecode(os.fsencode(str(tmp_path)) + b"/caf\xe9")
    os.mkdir(folder)
    write_tensors(os.path.join(folder, "m.safetensors"), TENSORS)
    tensors, _ = read_tensor_file(os.path.join(folder, "m.safetensors"))
    assert torch.equal(tensors["b"], TENSORS["b"])


POINTER = (
    "version https://git-lfs.github.com/spec/v1\n"
    "oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\nsize 12345\n"
)


def test_a_git_lfs_pointer_is_named_as_such(tmp_path):
    """A clone without git-lfs leaves a pointer where the weights were: said so, not "header too large"."""
    file = tmp_path / "model.safetensors"
    file.write_text(POINTER)
    with pytest.raises(QkovError, match="a git-lfs pointer, not the weights .*git lfs pull"):
        read_tensor_file(file)
    file.write_text("version 2 of something else\n")
    with pytest.raises(QkovError, match="truncated or corrupt"):
        read_tensor_file(file)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads Linux's VmRSS")
def test_page_out_gives_back_the_pages_a_mapped_view_spans(tmp_path):
    """A mapped tensor read whole holds its pages; :func:`page_out` of its blocks (rows, and the
    columns of its transpose) gives them back, and the tensor reads the same numbers after; a
    tensor that is no mapped view is left alone."""
    from qkov.tensorfile import map_tensor_file, page_out

    def resident() -> int:  # this process's, in bytes
        return (
            int(next(line for line in open("/proc/self/status") if line.startswith("VmRSS:")).split()[1])
            * 1024
        )

    x = torch.randn(2048, 8192).to(torch.bfloat16)  # 32 MiB
    save_file({"x": x}, tmp_path / "m.safetensors")
    mapped = map_tensor_file(tmp_path / "m.safetensors")[0]["x"].read()
    before = resident()
    assert torch.equal(mapped, x)
    touched = resident() - before
    for start in range(0, 1024, 256):
        page_out(mapped[start : start + 256])
    for start in range(1024, 2048, 256):
        page_out(mapped.mT[:, start : start + 256])
    assert touched > 24 * 2**20 and resident() - before < touched - 24 * 2**20, (touched, resident() - before)
    assert torch.equal(mapped, x)  # read again from the file
    copy = x.clone()
    page_out(copy)
    assert torch.equal(copy, x)
