"""Tokenization throughput: qkov's streaming, sharded tokenization (read, encode with the batch
encoder, split, write shards) against HF ``tokenizers``' own batch encoder on texts already in
memory, on the same documents, side by side in one run (MB of UTF-8 text per second).

    flock /tmp/qkov-heavy.lock python benchmarks/tokenize_throughput.py --megabytes 16
"""

from __future__ import annotations

import argparse
import itertools
import os
import tempfile
import time

from qkov.data.shards import sampled_tokenizer, sharded_tokens
from qkov.data.sources import CorpusFiles


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=float, default=16, help="the standard library's first N MB")
    parser.add_argument("--vocab-size", type=int, default=4096)
    args = parser.parse_args()
    os.environ["QKOV_CACHE"] = tempfile.mkdtemp(prefix="qkov-tokenize-")
    everything = CorpusFiles.find(None)
    sizes = itertools.accumulate(f.stat().st_size for f in everything.files)
    files = [f for f, total in zip(everything.files, sizes, strict=True) if total <= args.megabytes * 2**20]
    corpus = CorpusFiles(files, root=everything.root)
    texts = [d.text for d in corpus.documents()]
    megabytes = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts) / 2**20
    tokenizer = sampled_tokenizer(corpus, args.vocab_size)

    started = time.perf_counter()
    tokenizer.encode_batch(texts)
    hf = megabytes / (time.perf_counter() - started)
    started = time.perf_counter()
    data = sharded_tokens(corpus, tokenizer, show_progress=False)
    ours = megabytes / (time.perf_counter() - started)
    print(
        f"{megabytes:.1f} MB of the standard library ({len(texts)} files, "
        f"{len(data.train) + len(data.eval):,} tokens), vocabulary {args.vocab_size}, {os.cpu_count()} cores"
    )
    print(f"HF tokenizers encode_batch (in memory): {hf:6.2f} MB/s")
    print(f"qkov sharded_tokens (read + encode + write): {ours:6.2f} MB/s ({ours / hf:.2f}x)")


if __name__ == "__main__":
    main()
