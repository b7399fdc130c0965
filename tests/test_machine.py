"""qkov.machine: the devices a command may use, the matmul rate, the model FLOPs of training and
the time estimate ``qkov reproduce`` prints."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import qkov
from qkov import machine
from qkov.errors import QkovError
from qkov.machine import (
    TRAINING_UTILISATION,
    compute_device,
    matmul_rate,
    model_flops_per_token,
    training_seconds,
)


def test_model_flops_count_every_matmul_of_a_forward_pass():
    cfg = qkov.Config(n_layers=2, n_heads=4, d_model=128, d_head=32, d_vocab=2048, n_ctx=128)
    # per layer: Q, K, V, O (4 x 2 x 128 x 128) and scores + mixing over half the 128 positions
    # (2 x 2 x 128 x 64); the unembedding 2 x 128 x 2048
    assert model_flops_per_token(cfg, 128) == 2 * (131072 + 32768) + 524288
    mlp = qkov.Config(n_layers=1, n_heads=1, d_model=4, d_head=4, d_vocab=10, n_ctx=8, d_mlp=16)
    assert model_flops_per_token(mlp, 8) == 2 * 4 * 4 * 4 + 2 * 2 * 4 * 4 + 2 * 2 * 4 * 16 + 2 * 4 * 10


def test_the_estimate_is_three_forward_passes_at_the_measured_share_of_the_rate():
    """A 0-layer model is its unembedding: 2 x 8 x 100 = 1600 FLOP a token forward, 4800 in training.
    10 steps of 2 windows of 16 tokens are 320 tokens: 1,536,000 FLOP, 1.536 ms at 1 GFLOP/s used
    fully, and the run uses 0.41 of the rate (TRAINING_UTILISATION, measured on the fresh-clone run)."""
    assert TRAINING_UTILISATION == 0.41
    cfg = qkov.Config(n_layers=0, n_heads=1, d_model=8, d_head=8, d_vocab=100, n_ctx=16)
    seconds = training_seconds(cfg, steps=10, batch_size=2, rate=1e9)
    assert seconds == pytest.approx(1.536e-3 / 0.41)
    assert training_seconds(cfg, 10, 2, 2e9) == pytest.approx(seconds / 2)  # twice the rate, half the time


def test_the_matmul_rate_is_2n3_flop_over_the_best_time(monkeypatch):
    """With a clock that reads 0, 1, 3, 6, 10, 15, 21, 28 s: the warm-up ends at once (1 s is past
    its 0.5 s), and the three timed products take 6 - 3, 15 - 10 and 28 - 21 s: the best is 3 s."""
    readings = iter([0.0, 1.0, 3.0, 6.0, 10.0, 15.0, 21.0, 28.0])
    monkeypatch.setattr(machine, "perf_counter", lambda: next(readings))
    assert matmul_rate(n=64, reps=3) == 2 * 64**3 / 3.0


def test_a_device_that_is_not_here_is_one_line():
    assert compute_device("cpu") == torch.device("cpu")
    with pytest.raises(QkovError, match="only cpu and cuda"):
        compute_device("mps")
    with pytest.raises(QkovError, match="not a device name"):
        compute_device("gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(QkovError, match="no CUDA device is available here"):
            compute_device("cuda:0")


FREED_BLOCKS = textwrap.dedent(
    """
    import ctypes, sys, torch
    from qkov.machine import return_freed_blocks

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
            "keepcost")]

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    if sys.argv[1] == "set":
        assert return_freed_blocks()
    freed = torch.ones(2**22)  # 16 MiB, freed: glibc's default threshold rises to it
    del freed
    mapped = libc.mallinfo2().hblkhd
    block = torch.ones(2**19)  # 2 MiB
    print(libc.mallinfo2().hblkhd - mapped)
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_freed_blocks_are_mapped_apart_once_asked():
    """After a 16 MiB block is freed, glibc serves a 2 MiB block from its heap (where it stays when
    freed); once :func:`return_freed_blocks` has fixed the threshold, it maps it apart."""

    def mapped(mode: str) -> int:
        run = subprocess.run(
            [sys.executable, "-c", FREED_BLOCKS, mode], capture_output=True, text=True, check=True
        )
        return int(run.stdout)

    assert mapped("default") == 0
    assert mapped("set") >= 2**21


HUGE_PAGES = textwrap.dedent(
    """
    import sys, torch
    from qkov.cli import main

    try:
        main(["analyze", "no-such-folder", *sys.argv[1:]])  # one line and exit status 2, no tensor
    except SystemExit:
        pass
    block = torch.ones(2**24)  # 64 MiB, touched
    rollup = open("/proc/self/smaps_rollup").read().splitlines()
    print(next(int(line.split()[1]) for line in rollup if line.startswith("AnonHugePages:")))
    """
)


def _thp_mode() -> str | None:
    """The kernel's transparent huge page mode (``always``, ``madvise``, ``never``), None off Linux."""
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return None
    return text.split("[")[1].split("]")[0]


@pytest.mark.parametrize(
    ("flags", "preset", "huge"),
    [(["--lazy"], None, True), (["--weights-only"], None, True), ([], None, False), (["--lazy"], "0", False)],
)
def test_a_lazy_analysis_asks_for_huge_pages_unless_told_not_to(flags, preset, huge):
    """``qkov analyze --lazy`` (or ``--weights-only``) sets PyTorch's ``THP_MEM_ALLOC_ENABLE``
    before its first tensor, so that a 64 MiB tensor is backed by huge pages where the kernel gives
    them on request (its ``madvise`` mode); an analysis of a model read whole does not, and a
    user's 0 is kept."""
    mode = _thp_mode()
    if mode != "madvise":
        pytest.skip(f"the kernel's huge pages are {mode}: not given on request alone")
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    if preset is not None:
        env["THP_MEM_ALLOC_ENABLE"] = preset
    run = subprocess.run(
        [sys.executable, "-c", HUGE_PAGES, *flags], capture_output=True, text=True, check=True, env=env
    )
    huge_kib = int(run.stdout)
    assert huge_kib >= 2048 if huge else huge_kib == 0
