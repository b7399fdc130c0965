"""Evidence, per depth, that a trained checkpoint shows the paper's finding for that depth.

- 0 layers: the direct path ``W_E W_U`` is a bigram table: correlation of its log-softmax with the
  corpus' bigram log-probabilities ``log P(next | current)`` (pairs seen at least 5 times);
- 1 layer: copying heads: each head's copying score ``Re(sum l) / sum |l|`` over the eigenvalues of
  its full OV circuit ``W_E W_V W_O W_U``, against random factors of the same shapes;
- 2+ layers: previous-token scores on held-out text, induction scores on random tokens repeated
  three times (the paper's test), and the loss on each repeat.

    python benchmarks/recipes.py runs/0-layer runs/1-layer runs/2-layer
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.nn.functional as F

import qkov
from qkov.circuits.heads import induction_scores, previous_token_scores
from qkov.data.corpus import read_corpus
from qkov.data.random_tokens import repeated_random_tokens
from qkov.data.tokens import cached_tokens


def bigram_correlation(model: qkov.AttnOnlyTransformer, tokens: np.ndarray, min_count: int = 5) -> float:
    v = model.cfg.d_vocab
    pairs = tokens[:-1].astype(np.int64) * v + tokens[1:].astype(np.int64)
    counts = np.bincount(pairs, minlength=v * v).reshape(v, v)
    totals = counts.sum(1, keepdims=True)
    seen = counts >= min_count
    corpus = np.log(counts[seen] / np.broadcast_to(totals, counts.shape)[seen])
    with torch.no_grad():
        table = F.log_softmax((model.W_E @ model.W_U).double(), dim=-1).numpy()
    return float(np.corrcoef(corpus, table[seen])[0, 1])


def copying(model: qkov.AttnOnlyTransformer) -> None:
    W_V = torch.stack([b.attn.W_V for b in model.blocks]).detach().double()
    W_O = torch.stack([b.attn.W_O for b in model.blocks]).detach().double()
    ov = model.W_E.detach().double() @ qkov.FactoredMatrix(W_V, W_O) @ model.W_U.detach().double()
    scores = qkov.copying_score(ov)
    baseline = qkov.random_copying_scores(ov[0, 0], n_samples=200, generator=torch.Generator().manual_seed(0))
    threshold = float(baseline.quantile(0.99))
    for layer, row in enumerate(scores):
        print(f"  copying scores, layer {layer}: " + " ".join(f"{float(s):+.2f}" for s in row))
    n_copying = int((scores > threshold).sum())
    print(
        f"  random baseline: mean {float(baseline.mean()):+.2f}, 99th percentile {threshold:+.2f}; "
        f"{n_copying} of {scores.numel()} heads above it"
    )


@torch.no_grad()
def induction(model: qkov.AttnOnlyTransformer, eval_tokens: np.ndarray) -> None:
    cfg = model.cfg
    n = (len(eval_tokens) // cfg.n_ctx) * cfg.n_ctx
    text = torch.from_numpy(np.asarray(eval_tokens[: min(n, 32 * cfg.n_ctx)], dtype=np.int64)).reshape(
        -1, cfg.n_ctx
    )
    _, cache = model.run_with_cache(text)
    prev = previous_token_scores(cache)
    period = cfg.n_ctx // 3
    repeated = repeated_random_tokens(32, period, 3, cfg.d_vocab, torch.Generator().manual_seed(0))
    logits, cache = model.run_with_cache(repeated)
    ind = induction_scores(cache, period)
    losses = F.cross_entropy(logits[:, :-1].transpose(1, 2), repeated[:, 1:], reduction="none").mean(0)
    per_repeat = [float(losses[i * period : (i + 1) * period - 1].mean()) for i in range(3)]
    for layer in range(cfg.n_layers):
        print(
            f"  layer {layer}: previous-token "
            + " ".join(f"{float(s):.2f}" for s in prev[layer])
            + "   induction "
            + " ".join(f"{float(s):.2f}" for s in ind[layer])
        )
    print("  loss on repeats 1/2/3 of random tokens: " + " / ".join(f"{x:.2f}" for x in per_repeat))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoints", nargs="+")
    parser.add_argument("--corpus", action="append", help="the corpus the checkpoints were trained on")
    args = parser.parse_args()
    corpus = read_corpus(args.corpus)
    for path in args.checkpoints:
        model = qkov.load(path)
        print(f"{path}: {model.cfg}")
        data = cached_tokens(corpus, model.tokenizer)
        if model.cfg.n_layers == 0:
            correlation = bigram_correlation(model, data.train)
            print(f"  bigram log-prob correlation (W_E W_U vs corpus): {correlation:.3f}")
        elif model.cfg.n_layers == 1:
            copying(model)
        else:
            induction(model, data.eval)


if __name__ == "__main__":
    main()
