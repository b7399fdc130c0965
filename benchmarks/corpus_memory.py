"""Peak memory of the corpus pipeline (find the files, train the tokenizer on its sample, tokenize
into shards) against the corpus' size: a generated corpus at two sizes, as ``.jsonl`` and as a
folder of plain-text files, each size run in a fresh subprocess (its peak RSS, ``VmHWM``, alone),
printed side by side. The peak should not grow with the corpus beyond noise.

    flock /tmp/qkov-heavy.lock python benchmarks/corpus_memory.py --megabytes 10 120
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

WORDS = 20_000  # distinct words of the generated text: the tokenizer's word counts stay bounded
DOC_WORDS = (50, 600)  # words per document

# One run of the pipeline in this process; prints the peak RSS after the tokenizer and at the end.
PIPELINE = """
import sys, time
from qkov.data.shards import sampled_tokenizer, sharded_tokens
from qkov.data.sources import CorpusFiles

def peak():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1]) / 1024

started = time.perf_counter()
corpus = CorpusFiles.find([sys.argv[1]])
tokenizer = sampled_tokenizer(corpus, int(sys.argv[2]))
after_tokenizer = peak()
data = sharded_tokens(corpus, tokenizer, show_progress=False)
print(after_tokenizer, peak(), len(data.train) + len(data.eval), time.perf_counter() - started)
"""


def documents(megabytes: float, seed: int = 0):
    """Generated documents of pseudo-words, about ``megabytes`` MiB of text in all."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    pool = np.array(["".join(rng.choice(letters, rng.integers(2, 10))) for _ in range(WORDS)])
    size = 0
    while size < megabytes * 2**20:
        words = pool[rng.integers(0, WORDS, rng.integers(*DOC_WORDS))]
        text = " ".join(words) + "\n"
        size += len(text)
        yield text


def write_corpus(folder: Path, kind: str, megabytes: float) -> Path:
    folder.mkdir(parents=True)
    if kind == "jsonl":
        path = folder / "corpus.jsonl"
        with open(path, "w") as f:
            for text in documents(megabytes):
                f.write(json.dumps({"text": text}) + "\n")
        return path
    for i, text in enumerate(documents(megabytes)):  # plain text: one document per file
        (folder / f"{i:07d}.txt").write_text(text)
    return folder


def measure(corpus: Path, vocab_size: int, cache: Path) -> tuple[float, float, int, float]:
    result = subprocess.run(
        [sys.executable, "-c", PIPELINE, str(corpus), str(vocab_size)],
        capture_output=True,
        text=True,
        env=os.environ | {"QKOV_CACHE": str(cache)},
    )
    if result.returncode:
        raise SystemExit(result.stderr)
    tokenizer_peak, peak, tokens, seconds = result.stdout.split()
    return float(tokenizer_peak), float(peak), int(tokens), float(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=float, nargs=2, default=[10, 120], help="the two sizes (MiB)")
    parser.add_argument("--vocab-size", type=int, default=2048)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="qkov-corpus-memory-"))
    print(f"peak RSS (VmHWM) of the corpus pipeline, vocabulary {args.vocab_size}, {os.cpu_count()} cores")
    for kind in ("jsonl", "text"):
        peaks = []
        for megabytes in args.megabytes:
            name = f"{kind}-{megabytes:g}"
            corpus = write_corpus(root / name, kind, megabytes)
            tokenizer_peak, peak, tokens, seconds = measure(corpus, args.vocab_size, root / "cache" / name)
            peaks.append(peak)
            print(
                f"{kind:5s} {megabytes:6.0f} MiB: {tokens:>11,} tokens in {seconds:5.1f} s; peak "
                f"{tokenizer_peak:6.1f} MiB after the tokenizer, {peak:6.1f} MiB at the end"
            )
        ratio = args.megabytes[1] / args.megabytes[0]
        growth = f"{peaks[1] - peaks[0]:+.1f} MiB ({peaks[1] / peaks[0]:.2f}x)"
        print(f"{kind:5s} {ratio:.0f}x the corpus: peak {growth}")


if __name__ == "__main__":
    main()
