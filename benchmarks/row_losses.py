"""Next-token losses read off a final stream (``qkov.loss.row_losses``, under ``stream_losses`` and
term importance's losses by order): the logits formed a block of rows and columns at a time, as
the code's ``logit_buffer`` gives on a CPU, against whole rows (a buffer as wide as the vocabulary,
as the code did before), and against ``--blocks``, taking turns in one run, on every core.

    flock /tmp/qkov-heavy.lock python benchmarks/row_losses.py
    flock /tmp/qkov-heavy.lock python benchmarks/row_losses.py --blocks 2048x512,512x2048

Shapes: GPT-2 small's (d_model 768, 50,257 outputs) and Llama-3.2-1B's (2,048, 128,256), on 1,040
rows (8 x 130 tokens, what ``qkov analyze`` reads) and at GPT-2's on 4 x 1,040 (four ablations
stacked). Random weights: the cost depends on the shapes alone. Each variant's losses are checked
against the float64 ``token_losses`` of the whole logits first.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from qkov.loss import GPU_LOGIT_BYTES, logit_buffer, row_losses, token_losses
from qkov.machine import matmul_rate

SHAPES = {"gpt2": (768, 50257, 1040), "gpt2 x4": (768, 50257, 4160), "llama-3.2-1b": (2048, 128256, 1040)}


def whole_rows(rows: int, W_U: torch.Tensor) -> torch.Tensor:
    """A buffer of whole rows, as many as ``GPU_LOGIT_BYTES`` hold: the code before blocks of columns."""
    fits = GPU_LOGIT_BYTES // (W_U.element_size() * W_U.shape[1])
    return torch.empty(min(rows, fits), W_U.shape[1])


def compare(shape: str, blocks: list[tuple[int, int]], repeats: int) -> None:
    d_model, d_vocab, rows = SHAPES[shape]
    generator = torch.Generator().manual_seed(0)
    W_U = torch.randn(d_vocab, d_model, generator=generator).T * d_model**-0.5  # tied: a transposed view
    normed = torch.randn(rows, d_model, generator=generator)
    targets = torch.randint(0, d_vocab, (rows,), generator=generator)
    targets[::7] = -100
    buffers = {"code's blocks": logit_buffer(rows, W_U), "whole rows": whole_rows(rows, W_U)}
    buffers |= {f"{r}x{c}": torch.empty(min(rows, r), c) for r, c in blocks}
    exact = token_losses((normed.double() @ W_U.double())[None], targets[None])[0]
    for name, buffer in buffers.items():
        error = (row_losses(normed, W_U, None, targets, buffer).double() - exact).abs().max()
        assert error < 1e-4, (name, float(error))
    seconds: dict[str, list[float]] = {name: [] for name in buffers}
    for _ in range(repeats):
        for name, buffer in buffers.items():
            started = time.perf_counter()
            row_losses(normed, W_U, None, targets, buffer)
            seconds[name].append(time.perf_counter() - started)
    flop = 2 * rows * d_model * d_vocab
    base = statistics.median(seconds["whole rows"])
    print(f"{shape}: {rows} rows, d_model {d_model}, {d_vocab} outputs ({flop / 1e9:.0f} GFLOP a call)")
    for name, times in seconds.items():
        median = statistics.median(times)
        block = "x".join(map(str, buffers[name].shape))
        print(
            f"  {name:14s} {block:>12s}  median {median:.3f} s ({min(times):.3f}-{max(times):.3f}), "
            f"{flop / median / 1e9:4.0f} GFLOP/s, {median / base:.2f}x whole rows"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", default="", help="more block shapes, ROWSxCOLUMNS,...")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    blocks = [tuple(int(n) for n in b.split("x")) for b in args.blocks.split(",") if b]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"fp32 matmul rate before: {matmul_rate() / 1e9:.0f} GFLOP/s")
    for shape in SHAPES:
        compare(shape, blocks, args.repeats)
    print(f"fp32 matmul rate after: {matmul_rate() / 1e9:.0f} GFLOP/s")


if __name__ == "__main__":
    main()
