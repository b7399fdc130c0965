"""The direct path as a bigram table (section "Zero-Layer Transformers").

A zero-layer transformer predicts the next token from the current one alone, through
``W_E W_U`` (the paper's ``W_U W_E``): the best it can do is the corpus' bigram statistics
``P(next | current)``. Deeper models keep a direct path, which the paper finds still holds
bigram-like facts. With standard positions the direct path also carries ``W_pos``; its mean over
positions is added here, so the table is the average position's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from qkov.errors import QkovError
from qkov.model import AttnOnlyTransformer

FREQUENT_TOKENS = 1000  # rows compared: the most common current tokens
MIN_PAIR_COUNT = 5  # pairs seen fewer times are too noisy for the correlation


@dataclass(frozen=True)
class BigramCounts:
    """Sparse bigram counts of a token array: ``counts[i]`` occurrences of ``(current[i], next[i])``."""

    current: np.ndarray
    next: np.ndarray
    counts: np.ndarray
    unigram: np.ndarray  # occurrences of each token as the current token, [d_vocab]

    @classmethod
    def of(cls, tokens: np.ndarray, d_vocab: int, chunk: int = 2**22) -> BigramCounts:
        """The counts of ``tokens``: an array, or any token sequence read in contiguous slices (the
        sharded tokens of a corpus larger than memory), ``chunk`` pairs at a time with one token of
        overlap (the pair across a chunk's edge). Memory is bounded by the chunk and the number of
        distinct pairs; the counts are those of the whole sequence at once."""
        if len(tokens) < 2:
            raise QkovError("bigram statistics need a corpus of at least 2 tokens")
        pairs, counts = np.empty(0, np.int64), np.empty(0, np.int64)
        unigram, largest = np.zeros(d_vocab, np.int64), 0
        for start in range(0, len(tokens) - 1, chunk):
            part = np.asarray(tokens[start : start + chunk + 1], dtype=np.int64)
            largest = max(largest, int(part.max()))
            if largest >= d_vocab:
                continue  # an error below, naming the largest id
            new, new_counts = np.unique(part[:-1] * d_vocab + part[1:], return_counts=True)
            pairs, inverse = np.unique(np.concatenate([pairs, new]), return_inverse=True)
            merged = np.zeros(len(pairs), np.int64)
            np.add.at(merged, inverse, np.concatenate([counts, new_counts]))
            counts = merged
            unigram += np.bincount(part[:-1], minlength=d_vocab)
        if largest >= d_vocab:
            raise QkovError(f"corpus token id {largest} is outside the model's vocabulary ({d_vocab})")
        return cls(pairs // d_vocab, pairs % d_vocab, counts, unigram)


def direct_path_log_probs(
    model: AttnOnlyTransformer, rows: Tensor | None = None
) -> Float[Tensor, "rows d_vocab"]:
    """``log_softmax(W_E W_U)`` (plus the mean ``W_pos`` when standard, plus ``b_U``) for the
    given current tokens (all when ``rows`` is None), in float64. With LayerNorm the embedding
    passes through ``ln_final`` first, as it would in the direct path."""
    with torch.no_grad():
        embed = model.W_E if rows is None else model.W_E[rows]
        embed = embed.double()
        if model.cfg.positional_embedding == "standard":
            embed = embed + model.W_pos.double().mean(0)
        if model.ln_final is not None:
            embed = model.ln_final(embed)  # float64 in, float64 out (the weights promote)
        logits = embed @ model.W_U.double()
        if model.b_U is not None:
            logits = logits + model.b_U.double()
        return F.log_softmax(logits, dim=-1)


@dataclass(frozen=True)
class BigramExample:
    """A common current token: how often it occurs, and its top next tokens ``(token, probability)``
    in the corpus and under the direct path."""

    token: int
    count: int
    corpus: list[tuple[int, float]]
    model: list[tuple[int, float]]


@dataclass(frozen=True)
class BigramComparison:
    """The direct path against the corpus' bigrams, over the most common current tokens.

    ``kl``: ``KL(corpus || model)`` in nats per token, weighted by how often each current token
    occurs (0 would be a perfect bigram table); ``corpus_entropy``: the corpus' conditional entropy
    over the same tokens (the loss floor of a bigram model); ``correlation``: Pearson correlation of
    ``log P(next | current)`` between the two over pairs seen at least ``MIN_PAIR_COUNT`` times;
    ``examples``: for the most common tokens, the model's and the corpus' top next tokens.
    """

    kl: float
    corpus_entropy: float
    correlation: float | None  # None: too few pairs seen often enough, or one side constant
    tokens_compared: int
    pairs_compared: int
    examples: list[BigramExample]


def _pearson(x: np.ndarray, y: np.ndarray) -> float | None:
    """Pearson's correlation; None when it is undefined (fewer than 3 pairs, or a constant side:
    a direct path that predicts every next token alike)."""
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    return float(np.corrcoef(x, y)[0, 1])


def compare_bigrams(
    model: AttnOnlyTransformer, counts: BigramCounts, n_examples: int = 12, top: int = 5
) -> BigramComparison:
    rows = np.argsort(-counts.unigram, kind="stable")[:FREQUENT_TOKENS]
    rows = rows[counts.unigram[rows] > 0]
    current = torch.from_numpy(rows).to(model.device)
    model_lp = direct_path_log_probs(model, current).cpu().numpy()  # [rows, d_vocab]
    row_of = np.full(len(counts.unigram), -1)
    row_of[rows] = np.arange(len(rows))
    keep = row_of[counts.current] >= 0
    r, nxt, c = row_of[counts.current[keep]], counts.next[keep], counts.counts[keep].astype(np.float64)
    p = c / counts.unigram[counts.current[keep]]
    weight = counts.unigram[rows] / counts.unigram[rows].sum()
    kl_rows = np.bincount(r, weights=p * (np.log(p) - model_lp[r, nxt]), minlength=len(rows))
    entropy_rows = np.bincount(r, weights=-p * np.log(p), minlength=len(rows))
    seen = c >= MIN_PAIR_COUNT
    correlation = _pearson(np.log(p[seen]), model_lp[r[seen], nxt[seen]])
    examples = []
    for i in range(min(n_examples, len(rows))):
        mine = np.flatnonzero(r == i)
        best = mine[np.argsort(-p[mine], kind="stable")[:top]]
        model_best = np.argsort(-model_lp[i], kind="stable")[:top]
        examples.append(
            BigramExample(
                token=int(rows[i]),
                count=int(counts.unigram[rows[i]]),
                corpus=[(int(nxt[j]), float(p[j])) for j in best],
                model=[(int(t), float(np.exp(model_lp[i, t]))) for t in model_best],
            )
        )
    return BigramComparison(
        kl=float((weight * kl_rows).sum()),
        corpus_entropy=float((weight * entropy_rows).sum()),
        correlation=correlation,
        tokens_compared=len(rows),
        pairs_compared=int(seen.sum()),
        examples=examples,
    )
