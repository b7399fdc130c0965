"""How precisely does one evaluation measure the in-context-learning score, with overlapping held-out
windows and without? (issue: verdicts that carry their uncertainty; the phase change's ICL score).

For each checkpoint given (e.g. the three models of ``qkov reproduce``), this draws the evaluation's
held-out windows ``--draws`` times from its corpus' held-out split (``--corpus``, default the one
``qkov train`` uses) at the trainer's budget (``--tokens``, 32,768 by default), once in overlapping
blocks of 8 (the trainer's windows, ``qkov.evaluation.overlapping_windows``) and once as independent
windows (blocks of 1), and prints per model and layout: the score's mean, its actual standard
deviation across the draws, and the mean of the standard error each evaluation logs, beside the
seeds and the machine.

    python studies/icl_windows.py CKPT [CKPT ...] [--draws 30] [--tokens 32768] [--corpus PATH]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from host import machine  # studies/host.py, beside this script

import qkov
from qkov.data.shards import corpus_tokens
from qkov.evaluation import ICL_BLOCK, evaluation_inputs, held_out_metrics


def spread(path: Path, held_out: np.ndarray, draws: int, tokens: int, block: int) -> tuple[float, ...]:
    model = qkov.load(path).eval()
    scores, errors = [], []
    for seed in range(draws):
        inputs = evaluation_inputs(model.cfg, held_out, tokens, seed=seed, block=block)
        with torch.no_grad():
            row = held_out_metrics(model, inputs.windows, inputs.block)
        scores.append(row["icl_score"]), errors.append(row["icl_score_se"])
    return float(np.mean(scores)), float(np.std(scores, ddof=1)), float(np.mean(errors))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoints", nargs="+", type=Path)
    parser.add_argument("--draws", type=int, default=30)
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--corpus", default=None)
    args = parser.parse_args()
    print(f"# {machine()}; draws: evaluation seeds 0-{args.draws - 1}; {args.tokens} held-out tokens each")
    print("| model | windows | ICL score (mean) | SD over draws | logged SE (mean) |")
    print("|---|---|---|---|---|")
    for path in args.checkpoints:
        held_out = corpus_tokens(args.corpus, qkov.load(path).tokenizer).eval
        for block, label in ((ICL_BLOCK, f"overlapping, blocks of {ICL_BLOCK}"), (1, "independent")):
            mean, sd, se = spread(path, held_out, args.draws, args.tokens, block)
            print(f"| {path.name} | {label} | {mean:.4f} | {sd:.4f} | {se:.4f} |")


if __name__ == "__main__":
    main()
