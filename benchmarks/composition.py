"""All Q/K/V composition scores: qkov against TransformerLens 3.x ``all_composition_scores``,
side by side in one run, on a random 12-layer x 12-head model (d_model 768, d_head 64: GPT-2
small's attention shapes), float32, one thread (``--threads``: more), with the fp32 matmul rate
measured beside it.

    python benchmarks/composition.py              # about 40 s and 9 GB of memory at peak (TransformerLens)
    python benchmarks/composition.py --threads 2 --no-transformer-lens   # both cores, qkov alone
    python benchmarks/composition.py --layers 4   # a quicker look

Prints time and peak extra resident memory per kind, and the largest difference between the two
libraries' raw scores. qkov's baseline (expected score of random heads, computed once per shape
and cached) is timed with all three kinds, cold and warm.
"""

from __future__ import annotations

import argparse

import torch

import qkov
from qkov.circuits.composition import all_raw_composition_scores, raw_composition_scores
from qkov.machine import matmul_rate

from peak_memory import measure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--d-model", type=int, default=768)
    parser.add_argument("--d-head", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-transformer-lens", action="store_true", help="qkov's timings only")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = qkov.Config(
        n_layers=args.layers,
        n_heads=args.heads,
        d_model=args.d_model,
        d_head=args.d_head,
        d_vocab=1000,
        n_ctx=16,
    )
    model = qkov.AttnOnlyTransformer(cfg)  # random weights: the cost does not depend on their values
    print(
        f"{args.layers} layers x {args.heads} heads, d_model {args.d_model}, d_head {args.d_head}, "
        f"{args.threads} thread(s); fp32 matmul {matmul_rate() / 1e9:.0f} GFLOP/s"
    )

    def all_three():
        baseline = qkov.composition_baseline(cfg.d_model, cfg.d_head)
        return {kind: raw - baseline for kind, raw in all_raw_composition_scores(model).items()}

    # first, in a fresh process: the baseline is computed once per shape, then cached
    _, cold_s, cold_mem = measure(all_three)
    _, warm_s, warm_mem = measure(all_three)
    print(
        "qkov, all three kinds at once (all_raw_composition_scores), baseline subtracted: "
        f"{cold_s:.2f} s and {cold_mem / 2**20:.0f} MiB the first time (baseline included), "
        f"{warm_s:.2f} s after"
    )
    ours = {kind: measure(lambda kind=kind: raw_composition_scores(model, kind)) for kind in "QKV"}
    if args.no_transformer_lens:
        print("one kind at a time:", ", ".join(f"{kind} {s:.2f} s" for kind, (_, s, _) in ours.items()))
        return
    hooked = qkov.interop.to_hooked_transformer(model)
    with torch.no_grad():
        theirs = {kind: measure(lambda kind=kind: hooked.all_composition_scores(kind)) for kind in "QKV"}
    print("one kind at a time, raw scores (peak memory above the process's, which earlier calls have grown):")
    header = ("kind", "qkov s", "qkov MiB", "TL s", "TL MiB", "speed-up", "max |diff|")
    print(" ".join(f"{h:>10}" for h in header))
    for kind in "QKV":
        (q, q_s, q_mem), (t, t_s, t_mem) = ours[kind], theirs[kind]
        valid = ~q.isnan()
        diff = float((q[valid] - t[valid]).abs().max())
        mib = (f"{q_mem / 2**20:.0f}", f"{t_mem / 2**20:.0f}")
        row = (kind, f"{q_s:.2f}", mib[0], f"{t_s:.2f}", mib[1], f"{t_s / q_s:.1f}x")
        print(" ".join(f"{c:>10}" for c in row), f"{diff:10.1e}")


if __name__ == "__main__":
    main()
