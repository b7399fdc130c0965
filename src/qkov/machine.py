"""What this machine has and what a run costs on it: the devices a command may compute on, its matmul
rate, the model FLOPs of training, and from the two an estimate of the whole ``qkov reproduce``
run's time, which it prints before it starts.

Training a small attention-only model is bound by its matrix multiplications, so its time scales
with the machine's fp32 matmul rate; the measured share of that rate the trainer reaches
over a whole run (``TRAINING_UTILISATION``, measured) turns FLOPs into seconds.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from time import perf_counter

import torch

from qkov.config import Config
from qkov.errors import QkovError

# The model FLOPs of training per second of the whole ``qkov reproduce`` run (tokenizer, evaluations,
# checkpoints and analyses included), as a share of the fp32 matmul rate with all threads: 0.41 on
# the 2-core machine's fresh-clone run (630 s; the 2-layer model at 29.6k tokens/s, as at a measured
# 180 GFLOP/s). The tiny models' matmuls are small; softmax, the optimizer and Python fill the rest.
TRAINING_UTILISATION = 0.41
WARM_UP_S = 0.5  # of matmuls before timing: a cold start once read half the rate (86 against 180)
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)
FREED_BLOCK_BYTES = 2**20  # blocks from this size up are mapped apart, and unmapped when freed


def compute_device(name: str) -> torch.device:
    """``"cpu"``, ``"cuda"``, ``"cuda:1"`` ... checked against this machine, with one clear error
    for what is not here (``--device`` of ``train``, ``analyze`` and ``reproduce``)."""
    try:
        device = torch.device(name)
    except RuntimeError:
        raise QkovError(f"--device {name!r}: not a device name (cpu, cuda, cuda:1, ...)") from None
    if device.type not in ("cpu", "cuda"):
        raise QkovError(f"--device {name}: only cpu and cuda are supported")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise QkovError(f"--device {name}: no CUDA device is available here")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise QkovError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


def matmul_rate(
    dtype: torch.dtype = torch.float32, n: int = 2048, device: str = "cpu", reps: int = 5
) -> float:
    """The matmul rate (FLOP/s) at an ``n x n`` square size (on the CPU with the current threads),
    best of ``reps`` after ``WARM_UP_S`` seconds of the same products."""
    a, b = (torch.randn(n, n, dtype=dtype, device=device) for _ in range(2))
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else lambda: None
    warm_until = perf_counter() + WARM_UP_S
    while perf_counter() < warm_until:
        a @ b
        sync()
    best = float("inf")
    for _ in range(reps):
        sync()
        started = perf_counter()
        a @ b
        sync()
        best = min(best, perf_counter() - started)
    return 2 * n**3 / best


def model_flops_per_token(cfg: Config, seq: int) -> float:
    """Forward matmul FLOPs per token: Q, K, V, O projections, scores and mixing, the MLP, the
    unembedding (training costs three times this: forward, and the two products of the backward)."""
    hd = cfg.n_heads * cfg.d_head
    per_layer = 2 * 4 * cfg.d_model * hd + 2 * 2 * hd * seq / 2 + 2 * 2 * cfg.d_model * cfg.d_mlp
    return cfg.n_layers * per_layer + 2 * cfg.d_model * cfg.d_vocab


def training_seconds(cfg: Config, steps: int, batch_size: int, rate: float) -> float:
    """The estimated share of a whole run's time that ``steps`` steps of ``batch_size`` windows take
    at a matmul rate of ``rate`` (:data:`TRAINING_UTILISATION` includes the work around training)."""
    tokens = steps * batch_size * cfg.n_ctx
    return tokens * 3 * model_flops_per_token(cfg, cfg.n_ctx) / (rate * TRAINING_UTILISATION)


def return_freed_blocks() -> bool:
    """Make glibc give large freed blocks back to the system at once, for the rest of the process.

    By default glibc raises its mmap threshold to the size of each large block freed (up to 32 MiB),
    so that later blocks of that size come from its heap and stay there when freed: a lazy model
    freeing a layer's temporaries after another kept 300-400 MiB more at Llama-3.2-1B's shapes
    (peak 4.0 against 3.6 GiB, ``benchmarks/scale.py``). A fixed threshold (``FREED_BLOCK_BYTES``)
    maps every block from 1 MiB up apart and unmaps it when freed. Whether it was set: False off
    glibc (macOS, Windows, musl), where nothing changes."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(M_MMAP_THRESHOLD, FREED_BLOCK_BYTES))
    except (OSError, AttributeError):  # no libc by that name, or one without mallopt (musl)
        return False
