"""The cost of bit-reproducible embedding gradients: ``F.embedding`` (deterministic CPU backward)
against ``W_E[tokens]`` (``index_put_`` with accumulate, whose multi-threaded order varies), forward
plus backward at the default 2-layer training shape, alternated in one run; and how often each
gives the same bits twice.

    python benchmarks/embedding_backward.py --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=8 * 128, help="tokens per batch (default 8 x 128)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    W_E = torch.randn(args.vocab_size, args.d_model, generator=gen, requires_grad=True)
    tokens = torch.randint(0, args.vocab_size, (args.tokens,), generator=gen)
    upstream = torch.randn(args.tokens, args.d_model, generator=gen)
    ways = {"F.embedding": lambda: F.embedding(tokens, W_E), "W_E[tokens]": lambda: W_E[tokens]}

    def grad(way) -> tuple[float, torch.Tensor]:
        W_E.grad = None
        started = time.perf_counter()
        ways[way]().backward(upstream)
        return time.perf_counter() - started, W_E.grad.clone()

    times: dict[str, list[float]] = {way: [] for way in ways}
    differing = dict.fromkeys(ways, 0)
    first = {way: grad(way)[1] for way in ways}
    for _ in range(args.reps):
        for way in ways:
            seconds, g = grad(way)
            times[way].append(seconds)
            differing[way] += not torch.equal(g, first[way])
    print(f"W_E {args.vocab_size} x {args.d_model}, {args.tokens} tokens, {args.threads} thread(s), "
          f"torch {torch.__version__}")  # fmt: skip
    for way in ways:
        print(
            f"{way:12s} forward+backward {1e6 * statistics.median(times[way]):7.0f} us (median); "
            f"gradient differs from the first run's in {differing[way]}/{args.reps} runs"
        )


if __name__ == "__main__":
    main()
