"""The paper-size 2-layer model on one GPU, and DDP scaling on two: a check that a person with a GPU
runs in under 8 minutes (its figures, from an H200, are in benchmarks/README.md).

Trains ``--preset paper`` (12 heads x 64, d_model 768, n_ctx 2048, a 50,257-token byte-level BPE
trained on the Python standard library) for a fixed token budget in bf16 and prints tokens/s, the
model FLOPs utilisation against the GPU's bf16 matmul rate measured in the same run, the peak GPU
memory, and the strongest induction and previous-token scores reached (``metrics.jsonl``'s last
line). ``--gpus 2`` then trains the same budget with ``qkov train --nproc 2`` (torchrun, NCCL)
and prints the speed-up over one GPU. ``--compile-steps`` times that many steps with and without
``torch.compile`` (after the compiling steps).

    python benchmarks/gpu_train.py                  # one GPU
    python benchmarks/gpu_train.py --gpus 2         # and the 2-GPU DDP run
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from qkov.data.shards import sampled_tokenizer, sharded_tokens
from qkov.data.sources import CorpusFiles
from qkov.machine import matmul_rate, model_flops_per_token
from qkov.recipes import recipe
from qkov.train import Trainer
from qkov.training_log import METRICS_FILE


def timed_run(trainer: Trainer, tokens: int, resume: bool = False) -> float:
    """Run ``trainer`` to its last step; tokens per second."""
    torch.cuda.synchronize()
    started = time.perf_counter()
    trainer.run(resume=resume, show_progress=False)
    torch.cuda.synchronize()
    return tokens / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=float, default=100e6, help="token budget (default 100M)")
    parser.add_argument("--batch-size", type=int, default=32, help="sequences of 2048 tokens per step")
    parser.add_argument("--gpus", type=int, default=1, choices=[1, 2])
    parser.add_argument(
        "--compile-steps", type=int, default=50, help="steps timed with and without torch.compile (0: skip)"
    )
    parser.add_argument("--out", default=None, help="run folder (default: a temporary folder)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_train.py: no CUDA device here")
    out = Path(args.out or tempfile.mkdtemp(prefix="qkov-gpu-"))
    r = recipe(2, "paper")
    steps = max(1, int(args.tokens // (args.batch_size * r.model.n_ctx)))
    r = r.override(
        steps=steps, batch_size=args.batch_size, eval_every=steps, evals_per_decade=0, checkpoint_every=steps
    )
    started = time.perf_counter()
    corpus = CorpusFiles.find(None)
    tokenizer = sampled_tokenizer(corpus, r.vocab_size)
    data = sharded_tokens(corpus, tokenizer)
    cfg, train_cfg = r.configs(tokenizer.get_vocab_size())
    prepared = time.perf_counter() - started
    print(f"data: {len(data.train):,} tokens, vocabulary {cfg.d_vocab} ({prepared:.0f} s)")
    rate = matmul_rate(torch.bfloat16, 8192, "cuda", reps=10)
    print(f"{torch.cuda.get_device_name()}: measured bf16 matmul rate {rate / 1e12:.0f} TFLOP/s")

    trainer = Trainer(cfg, train_cfg, data, out / "1-gpu", tokenizer, device="cuda")
    torch.cuda.reset_peak_memory_stats()
    tps = timed_run(trainer, steps * args.batch_size * cfg.n_ctx)
    mfu = tps * 3 * model_flops_per_token(cfg, cfg.n_ctx) / rate
    last = json.loads((out / "1-gpu" / METRICS_FILE).read_text().splitlines()[-1])
    print(
        f"1 GPU: {steps} steps x {args.batch_size} x {cfg.n_ctx} tokens: {tps:,.0f} tokens/s, "
        f"MFU {100 * mfu:.1f}%, peak memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB"
    )
    print(
        f"reached: eval loss {last['eval_loss']:.3f}, induction score {last['induction_score']:.2f}, "
        f"previous-token score {last['previous_token_score']:.2f}"
    )
    if args.compile_steps:
        short = replace(train_cfg, steps=args.compile_steps, eval_every=args.compile_steps)
        runs = {}
        for compiled in (False, True):
            folder = out / f"compile-{compiled}"
            trainer = Trainer(cfg, short, data, folder, tokenizer, "cuda", compile=compiled)
            trainer.run(show_progress=False)  # the first steps compile: time a second run's worth
            trainer.train_cfg = replace(short, steps=2 * args.compile_steps)
            runs[compiled] = timed_run(trainer, args.compile_steps * args.batch_size * cfg.n_ctx, resume=True)
        print(
            f"torch.compile: {runs[True]:,.0f} against {runs[False]:,.0f} tokens/s eager "
            f"({runs[True] / runs[False]:.2f}x, after the compiling steps)"
        )
    if args.gpus == 2:
        flags = ["--preset", "paper", "--steps", str(steps), "--batch-size", str(args.batch_size)]
        flags += ["--eval-every", str(steps), "--evals-per-decade", "0"]
        flags += ["--checkpoint-every", str(steps), "--quiet"]
        started = time.perf_counter()
        command = [sys.executable, "-m", "qkov", "train", "--layers", "2", "--device", "cuda", "--nproc", "2"]
        subprocess.run([*command, *flags, "--out", str(out / "2-gpu")], check=True)
        ddp_tps = steps * args.batch_size * cfg.n_ctx / (time.perf_counter() - started)
        speedup = ddp_tps / tps
        print(f"2 GPUs (DDP, NCCL): {ddp_tps:,.0f} tokens/s, {speedup:.2f}x one GPU (start-up included)")
    print(f"runs in {out}")


if __name__ == "__main__":
    main()
