"""``qkov analyze`` of the paper's one-layer shape (section "One-Layer Attention-Only Transformers":
12 heads of 64, d_model 768, 50257 tokens), end to end in fresh processes, with its peak resident
memory, on a random and on a trained-like model, without and with a corpus, each with the exact
top-k searches screened in float32 and as qkov's probe chooses (bfloat16 where its products run at
least 1.25x float32's, ``qkov.topk._bf16_pays``); beside it, one head's skip-trigram table by every
source searched (the code before the pruned search) and by the pruned search with each screen, in
this process, with the matmul rate measured alongside.

- *random*: qkov's initialisation (every full circuit's spectrum about flat: nothing to prune);
- *trained-like*: the same, then each head's ``W_Q``, ``W_K``, ``W_V`` and ``W_O`` scaled along its
  ``d_head`` axis by ``i^-0.75`` (each circuit's singular values decay about as ``i^-1.5``) and the
  rows of ``W_E`` and columns of ``W_U`` by log-normal norms (``exp(0.5 N(0, 1))``), as in
  ``benchmarks/topk.py``;
- the corpus: a word-level tokenizer of the 50257 tokens ``w0 ... w50256`` and ``--words`` words
  drawn from a Zipf law (exponent 1.1) written as text: generated here, nothing downloaded.

    flock /tmp/qkov-heavy.lock python benchmarks/analyze_1layer.py              # about 10 minutes
    python benchmarks/analyze_1layer.py --vocab 8192 --words 200000             # a quick look
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from unittest.mock import patch

import numpy as np
import torch
from tokenizers import Tokenizer, models, pre_tokenizers

import qkov
from qkov import topk
from qkov.circuits import skip_trigrams
from qkov.data.tokenizer import END_OF_TEXT

from peak_memory import measure

RUN = (
    "import atexit, resource, runpy, sys, qkov.topk; "
    "sys.argv.pop(1) == 'float32' and setattr(qkov.topk, '_bf16_pays', lambda threads: False); "
    "peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss; "
    "atexit.register(lambda: print('MAXRSS', peak(), file=sys.stderr)); "
    "sys.argv = ['qkov', *sys.argv[1:]]; runpy.run_module('qkov', run_name='__main__')"
)


def one_layer(kind: str, vocab: int, seed: int = 0) -> qkov.AttnOnlyTransformer:
    torch.manual_seed(seed)
    model = qkov.AttnOnlyTransformer(qkov.Config(1, 12, 768, 64, vocab, 1024))
    if kind == "trained-like":
        gen = torch.Generator().manual_seed(seed)
        decay = torch.arange(1, 65, dtype=torch.float32) ** -0.75
        with torch.no_grad():
            attn = model.blocks[0].attn
            for W in (attn.W_Q, attn.W_K, attn.W_V):
                W.mul_(decay)
            attn.W_O.mul_(decay[:, None])
            model.W_E.mul_((0.5 * torch.randn(vocab, 1, generator=gen)).exp())
            model.W_U.mul_((0.5 * torch.randn(1, vocab, generator=gen)).exp())
    return model


def word_tokenizer(vocab: int) -> Tokenizer:
    words = {END_OF_TEXT: 0} | {f"w{i}": i for i in range(1, vocab)}  # id 0 separates documents
    tokenizer = Tokenizer(models.WordLevel(words, unk_token=END_OF_TEXT))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tokenizer


def write_corpus(folder: Path, vocab: int, words: int, seed: int = 0) -> Path:
    """``words`` Zipf-distributed words (ids 1 and up), 20 to a line."""
    gen = np.random.default_rng(seed)
    ranks = gen.zipf(1.1, size=words * 2)
    ids = ranks[ranks < vocab][:words]
    folder.mkdir(parents=True)
    lines = (" ".join(f"w{i}" for i in ids[at : at + 20]) for at in range(0, len(ids), 20))
    (folder / "corpus.txt").write_text("\n".join(lines) + "\n")
    return folder


def analyze(
    checkpoint: Path, out: Path, corpus: Path | None, threads: int, screen: str
) -> tuple[float, float]:
    """``qkov analyze`` in a fresh process: wall seconds (loading and writing included), peak GiB;
    ``screen``: "float32" to screen the exact top-k searches in float32 where bfloat16 would pay
    (:func:`qkov.topk._bf16_pays`), "probe" to screen as that probe says."""
    command = [sys.executable, "-c", RUN, screen, "analyze", str(checkpoint), "--out", str(out), "--quiet"]
    command += ["--threads", str(threads)] + (["--corpus", str(corpus)] if corpus else [])
    started = time.perf_counter()
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    rss = next(line for line in done.stderr.splitlines() if line.startswith("MAXRSS"))
    return seconds, int(rss.split()[1]) / 2**20


def difference(a, b) -> float:
    """The largest relative difference between two JSON values' numbers (``inf`` where their
    structure or any other value differs): the skip-trigram strengths of sources searched in other
    blocks may differ in the last bits (a float64 matmul's rows round with their block)."""
    if isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
        return max((difference(a[key], b[key]) for key in a), default=0.0)
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return max((difference(x, y) for x, y in zip(a, b, strict=True)), default=0.0)
    if isinstance(a, float) and isinstance(b, float) and a != b:
        return abs(a - b) / max(abs(a), abs(b))
    return 0.0 if a == b else math.inf


def matmul_rate(n: int) -> float:
    """fp32 GFLOP/s of the screening's product: 128 rows x 64 x n."""
    a, b, out = torch.randn(128, 64), torch.randn(64, n), torch.empty(128, n)
    for _ in range(10):  # warm: the first products run far below the rate
        torch.matmul(a, b, out=out)
    started = time.perf_counter()
    for _ in range(50):
        torch.matmul(a, b, out=out)
    return 2 * 128 * 64 * n * 50 / (time.perf_counter() - started) / 1e9


def one_head(model: qkov.AttnOnlyTransformer) -> str:
    """L0H0's table by every source searched and by the pruned search with each screen, timed in
    this process."""
    circuits = skip_trigrams.head_circuits(model, 0, 0)
    old, t_old, _ = measure(lambda: skip_trigrams._exhaustive(circuits, 50))
    line = f"one head's table: every source {t_old:.2f} s"
    for screen in ("float32", "bfloat16"):
        with patch.object(topk, "_bf16_pays", lambda threads, screen=screen: screen == "bfloat16"):
            new, t_new, _ = measure(lambda: skip_trigrams.strongest_skip_trigrams(circuits, 50))
        same = [(t.source, t.destination, t.out) for t in old] == [
            (t.source, t.destination, t.out) for t in new
        ]
        diff = max(
            (abs(a.strength - b.strength) / abs(a.strength) for a, b in zip(old, new, strict=True)), default=0
        )
        line += f"; pruned, {screen} screen {t_new:.2f} s ({t_old / t_new:.1f}x), same triples: {same}"
        line += f" (strengths within {diff:.0e} relative)"
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--words", type=int, default=2_000_000)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--kinds", nargs="+", default=["random", "trained-like"])
    parser.add_argument(
        "--screens",
        nargs="+",
        choices=("probe", "float32"),
        default=["float32", "probe"],
        help="qkov analyze's top-k screens: float32, or as qkov's probe chooses (bfloat16 where it pays)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load = os.getloadavg()[0]
    print(f"torch {torch.__version__}, {args.threads} threads, load average {load:.1f}; 1 layer x 12 x 64,")
    print(
        f"d_model 768, {args.vocab} tokens; fp32 matmul {matmul_rate(args.vocab):.0f} GFLOP/s "
        f"(128 x 64 x n); bfloat16 screen pays (qkov's probe): {topk._bf16_pays(args.threads)}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        corpus = write_corpus(folder / "corpus", args.vocab, args.words)
        for kind in args.kinds:
            model = one_layer(kind, args.vocab)
            qkov.save(model, folder / kind, word_tokenizer(args.vocab))
            print(kind)
            for label, text in (("no corpus", None), (f"corpus of {args.words} words", corpus)):
                for screen in args.screens:
                    out = folder / f"{kind}-{label}-{screen}"
                    seconds, gib = analyze(folder / kind, out, text, args.threads, screen)
                    load = os.getloadavg()[0]
                    print(
                        f"  qkov analyze, {label}, {screen} screen: {seconds:6.1f} s, peak {gib:.2f} GiB "
                        f"(load {load:.1f})"
                    )
                first, *rest = (
                    json.loads((folder / f"{kind}-{label}-{s}/results.json").read_text())
                    for s in args.screens
                )
                gaps = [difference(first, other) for other in rest]
                print(f"  results.json of every screen: the same to {max(gaps, default=0):.0e} relative")
            print("  " + one_head(model.eval()))
            print(f"  (matmul rate now {matmul_rate(args.vocab):.0f} GFLOP/s, load {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
