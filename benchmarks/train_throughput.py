"""Training and forward throughput of qkov against TransformerLens 3.x, side by side in one run.

Both libraries get the same attention-only config, batch, optimizer (AdamW) and thread count, and
train with their own next-token loss: ``model.loss(windows)`` in qkov (windows of ``n_ctx + 1``
tokens, the unembedding fused into the loss), ``model(tokens, return_type="loss")`` in
TransformerLens (``n_ctx`` tokens). Both run the model over ``n_ctx`` positions per sequence
(TransformerLens' last position has no target, so it scores one fewer). Tokens/s counts ``n_ctx``
tokens per sequence for both.
Measurements alternate between the two (qkov, TL, qkov, TL, ...) so that a noisy machine hits both
alike; the figure is the median over repetitions. Model FLOPs utilisation (MFU) is the model's
matmul FLOPs per second over the matmul rate, in the same precision, measured in the same run.

``--compile`` adds qkov's training step as ``qkov train --compile`` runs it (the loss module through
``torch.compile``, on a copy of the same model), compiled during the warm-up, so the figure is the
compiled steps' speed after compiling; the compile time is printed on its own.

    python benchmarks/train_throughput.py            # the issue's config, 1 thread
    python benchmarks/train_throughput.py --threads 2 --dtype bf16
    python benchmarks/train_throughput.py --threads 2 --compile --d-model 128 --n-heads 4 --d-head 32 \
        --vocab-size 2048 --n-ctx 128 --batch-size 8       # the default 2-layer model, compiled or not
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

import qkov
from qkov.machine import matmul_rate, model_flops_per_token
from qkov.train import NextTokenLoss


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--n-heads", type=int, default=8)
    parser.add_argument("--d-head", type=int, default=64)
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--n-ctx", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reps", type=int, default=6)
    parser.add_argument(
        "--dtype",
        choices=["fp32", "bf16"],
        default="fp32",
        help="bf16 = torch.autocast to bfloat16 for both libraries",
    )
    parser.add_argument("--compile", action="store_true", help="also qkov's step through torch.compile")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    cfg = qkov.Config(args.layers, args.n_heads, args.d_model, args.d_head, args.vocab_size, args.n_ctx)
    ours = qkov.AttnOnlyTransformer(cfg)
    theirs = qkov.interop.to_hooked_transformer(ours, cache_head_results=False)
    windows = torch.randint(0, cfg.d_vocab, (args.batch_size, cfg.n_ctx + 1))
    tokens = windows[:, :-1]
    n_tokens = tokens.numel()
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.dtype == "bf16")

    def train_step(model, optimizer, loss_fn):
        def step():
            with autocast:
                loss = loss_fn()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return step

    def forward(model):
        def run():
            with torch.inference_mode(), autocast:
                model(tokens)

        return run

    runs = {
        ("train", "qkov"): train_step(
            ours, torch.optim.AdamW(ours.parameters(), lr=1e-3), lambda: ours.loss(windows)
        ),
        ("train", "TransformerLens"): train_step(
            theirs,
            torch.optim.AdamW(theirs.parameters(), lr=1e-3),
            lambda: theirs(tokens, return_type="loss"),
        ),
        ("forward", "qkov"): forward(ours),
        ("forward", "TransformerLens"): forward(theirs),
    }
    if args.compile:
        twin = copy.deepcopy(ours)
        compiled = torch.compile(NextTokenLoss(twin))
        optimizer = torch.optim.AdamW(twin.parameters(), lr=1e-3)
        runs["train", "qkov compiled"] = train_step(twin, optimizer, lambda: compiled(windows))
    for key, fn in runs.items():  # warm-up (and compiling)
        seconds = timed(fn)
        if key[1] == "qkov compiled":
            print(f"torch.compile: the first step took {seconds:.1f} s")
    times: dict[tuple[str, str], list[float]] = {key: [] for key in runs}
    for _ in range(args.reps):
        for key, fn in runs.items():
            times[key].append(timed(fn))
    rate = matmul_rate(torch.bfloat16 if args.dtype == "bf16" else torch.float32)

    flops = model_flops_per_token(cfg, cfg.n_ctx)
    print(
        f"config: {args.layers} layers, d_model {args.d_model}, {args.n_heads} heads x {args.d_head}, "
        f"vocab {args.vocab_size}, batch {args.batch_size} x {args.n_ctx}, {args.threads} thread(s), "
        f"{args.dtype}, torch {torch.__version__}"
    )
    print(f"measured {args.dtype} matmul rate: {rate / 1e9:.0f} GFLOP/s")
    for kind, mult in (("train", 3), ("forward", 1)):
        tps = {lib: n_tokens / statistics.median(times[(kind, lib)]) for lib in ("qkov", "TransformerLens")}
        for lib, value in tps.items():
            mfu = value * flops * mult / rate
            print(f"{kind:8s} {lib:16s} {value:9.0f} tokens/s   MFU {100 * mfu:5.1f}%")
        print(f"{kind:8s} ratio qkov / TransformerLens: {tps['qkov'] / tps['TransformerLens']:.2f}x")
    if args.compile:
        compiled_tps = n_tokens / statistics.median(times[("train", "qkov compiled")])
        eager_tps = n_tokens / statistics.median(times[("train", "qkov")])
        ratio = compiled_tps / eager_tps
        print(f"train    qkov compiled    {compiled_tps:9.0f} tokens/s   {ratio:.2f}x qkov eager")


if __name__ == "__main__":
    main()
