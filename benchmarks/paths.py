"""Time and peak memory of ``path_expansion`` (by path and by order) and ``term_importance`` on the
default 2-layer model (4 heads per layer, d_model 128, n_ctx 128, d_vocab 4096), one thread.

    python benchmarks/paths.py                          # random weights of the default shapes
    python benchmarks/paths.py --checkpoint runs/2-layer # a trained model (same cost)
    python benchmarks/paths.py --first-order llama-3.2-1b --blocks 256x4096

``--first-order SHAPE`` times instead one layer's first-order log-sum-exps (the inner loop of
``term_importance``: every head's rank-``d_head`` logit terms over the whole vocabulary, on 1,032
rows as ``qkov analyze`` scores) at GPT-2 small's or Llama-3.2-1B's vocabulary and heads, with the
code's blocks of rows and columns and with ``--blocks``, taking turns, on every core.

The cost depends on the shapes, not on the weights' values. There is no TransformerLens
equivalent to compare with: it has no path expansion or term importance.
"""

from __future__ import annotations

import argparse

import torch

import qkov
from qkov.circuits import paths
from qkov.loss import row_blocks
from qkov.recipes import recipe

from peak_memory import measure

FIRST_ORDER_SHAPES = {"gpt2": (50257, 12), "llama-3.2-1b": (128256, 32)}  # vocabulary, heads of 64


def first_order(shape: str, blocks: tuple[int, int], repeats: int = 3) -> None:
    """Seconds for one layer's first-order log-sum-exps, code's blocks against ``blocks``, in turns."""
    vocabulary, heads = FIRST_ORDER_SHAPES[shape]
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(1032, vocabulary, generator=generator) * 2
    direct = paths._Direct.of(logits, torch.randint(0, vocabulary, (1032,), generator=generator))
    z = torch.randn(1032, heads, 64, generator=generator) * 0.02  # every head within REACH
    through = torch.randn(heads, 64, vocabulary, generator=generator)
    within = torch.ones(heads, dtype=torch.bool)

    def one_layer() -> None:
        for block in row_blocks(1032, paths.ROWS):
            paths._block_logsumexp(direct, block, z[block], through, within)

    runs = {(paths.ROWS, paths.COLUMNS): [], blocks: []}
    for _ in range(repeats):
        for rows, columns in runs:
            paths.ROWS, paths.COLUMNS = rows, columns
            runs[rows, columns].append(measure(one_layer)[1])
    print(f"{shape}: one layer's first-order log-sum-exps, {heads} heads, 1,032 rows, {vocabulary} outputs")
    for (rows, columns), seconds in runs.items():
        print(f"  blocks of {rows} x {columns}: " + ", ".join(f"{s:.2f}" for s in seconds) + " s")
    (code, other) = (min(seconds) for seconds in runs.values())
    print(f"  code's blocks / {blocks[0]} x {blocks[1]}, best of each: {code / other:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--first-order", choices=sorted(FIRST_ORDER_SHAPES))
    parser.add_argument("--blocks", default="256x4096", help="ROWSxCOLUMNS to compare (--first-order)")
    args = parser.parse_args()
    if args.first_order:
        rows, _, columns = args.blocks.partition("x")
        if not (rows.isdigit() and columns.isdigit() and int(rows) > 0 and int(columns) > 0):
            parser.error(f"--blocks is ROWSxCOLUMNS, two positive whole numbers, got {args.blocks!r}")
        first_order(args.first_order, (int(rows), int(columns)))
        return
    torch.set_num_threads(1)
    model = qkov.load(args.checkpoint) if args.checkpoint else qkov.AttnOnlyTransformer(recipe(2).model)
    cfg = model.cfg
    tokens = torch.randint(
        1, cfg.d_vocab, (args.batch, cfg.n_ctx), generator=torch.Generator().manual_seed(0)
    )
    print(f"{cfg}\nbatch {args.batch} x {cfg.n_ctx} tokens, 1 thread")
    with torch.no_grad():
        _, forward_s, forward_mem = measure(lambda: model(tokens))
        print(f"{'forward (reference)':32} {forward_s:6.2f} s {forward_mem / 2**20:7.0f} MiB")
        for label, fn in [
            ("path_expansion(by='path')", lambda: qkov.path_expansion(model, tokens)),
            ("path_expansion(by='order')", lambda: qkov.path_expansion(model, tokens, by="order")),
            ("term_importance", lambda: qkov.term_importance(model, tokens)),
        ]:
            result, seconds, memory = measure(fn)
            extra = f"  ({len(result)} terms)" if isinstance(result, dict) else ""
            print(f"{label:32} {seconds:6.2f} s {memory / 2**20:7.0f} MiB{extra}")


if __name__ == "__main__":
    main()
