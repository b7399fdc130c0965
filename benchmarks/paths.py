"""Time and peak memory of ``path_expansion`` (by path and by order) and ``term_importance`` on the
default 2-layer model (4 heads per layer, d_model 128, n_ctx 128, d_vocab 4096), one thread.

    python benchmarks/paths.py                          # random weights of the default shapes
    python benchmarks/paths.py --checkpoint runs/2-layer # a trained model (same cost)

The cost depends on the shapes, not on the weights' values. There is no TransformerLens
equivalent to compare with: it has no path expansion or term importance.
"""

from __future__ import annotations

import argparse

import torch

import qkov
from qkov.recipes import recipe

from peak_memory import measure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint")
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
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
