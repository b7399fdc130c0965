"""Exact ``self_top1`` (and self ranks) for every head of a GPT-2-small-shaped model on one GPU:
all 144 full OV circuits, every one of the 50257 rows of each, streamed in blocks (about 46 TFLOP).

    python benchmarks/spectra_gpu.py                # all 144 heads on cuda:0
    python benchmarks/spectra_gpu.py --layers 1     # a quicker look (12 heads)

Sized to finish well within 5 minutes on one recent GPU: the matmuls are 46.5 TFLOP in fp32 (TF32
stays off, torch's default) and the comparisons read 2.5 billion entries per head. Checks one
head against the CPU (exact there too) and prints the CPU-sampled estimate's interval beside the
GPU's exact value. Its figures on one H200 are in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import time

import torch

import qkov

from spectra import gpt2_shaped, one_head


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--sample-rows", type=int, default=500, help="the CPU estimate shown beside")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("spectra_gpu.py: no CUDA device")
    model = gpt2_shaped(args.layers, args.heads, 768, 64, args.vocab)
    print(
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}, "
        f"TF32 {torch.backends.cuda.matmul.allow_tf32}"
    )
    qkov.direct_copying(gpt2_shaped(1, 1, 768, 64, 1000), device=args.device, progress=False)  # warm up
    torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    exact = qkov.direct_copying(model, device=args.device)
    seconds = time.perf_counter() - started
    flops = len(exact) * 2 * args.vocab**2 * 64
    print(
        f"exact self_top1 for {len(exact)} heads: {seconds:.1f} s, {flops / seconds / 1e12:.1f} TFLOP/s, "
        f"{torch.cuda.max_memory_allocated() / 2**30:.2f} GiB peak on the GPU"
    )
    cpu = qkov.direct_copying(one_head(model, 0, 0), progress=False)[0]
    print(
        f"L0H0 on the CPU: self_top1 {cpu.self_top1:.6f}, median rank {cpu.self_rank_median:g}; "
        f"GPU: {exact[0].self_top1:.6f}, {exact[0].self_rank_median:g}"
    )
    gen = torch.Generator().manual_seed(0)
    sampled = qkov.direct_copying(model, args.sample_rows, generator=gen, progress=False)
    inside = sum(
        s.self_top1_ci[0] <= e.self_top1 <= s.self_top1_ci[1] for s, e in zip(sampled, exact, strict=True)
    )
    print(
        f"CPU sample of {args.sample_rows} rows: the 95% interval holds the exact value "
        f"for {inside} of {len(exact)} heads"
    )
    for row in sorted(exact, key=lambda r: -r.self_top1)[:5]:
        print(
            f"  {row.name}: self_top1 {row.self_top1:.5f}, "
            f"median rank {row.self_rank_median:g}, z {row.diagonal_z:+.3f}"
        )


if __name__ == "__main__":
    main()
