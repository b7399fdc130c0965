"""What a run costs on this machine: its matmul rate, the model FLOPs of training, and from the two an
estimate of the whole ``qkov reproduce`` run's time, which it prints before it starts.

Training a small attention-only model is bound by its matrix multiplications, so its time scales
with the machine's fp32 matmul rate; the measured share of that rate the trainer reaches
over a whole run (``TRAINING_UTILISATION``, measured) turns FLOPs into seconds.
"""

from __future__ import annotations

import time

import torch

from qkov.config import Config

# The model FLOPs of training per second of the whole ``qkov reproduce`` run (tokenizer, evaluations,
# checkpoints and analyses included), as a share of the fp32 matmul rate with all threads: 0.41 on
# the 2-core machine's fresh-clone run (630 s; the 2-layer model at 29.6k tokens/s, as at a measured
# 180 GFLOP/s). The tiny models' matmuls are small; softmax, the optimizer and Python fill the rest.
TRAINING_UTILISATION = 0.41
WARM_UP_S = 0.5  # of matmuls before timing: a cold start once read half the rate (86 against 180)


def matmul_rate(
    dtype: torch.dtype = torch.float32, n: int = 2048, device: str = "cpu", reps: int = 5
) -> float:
    """The matmul rate (FLOP/s) at an ``n x n`` square size (on the CPU with the current threads),
    best of ``reps`` after ``WARM_UP_S`` seconds of the same products."""
    a, b = (torch.randn(n, n, dtype=dtype, device=device) for _ in range(2))
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else lambda: None
    warm_until = time.perf_counter() + WARM_UP_S
    while time.perf_counter() < warm_until:
        a @ b
        sync()
    best = float("inf")
    for _ in range(reps):
        sync()
        started = time.perf_counter()
        a @ b
        sync()
        best = min(best, time.perf_counter() - started)
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
