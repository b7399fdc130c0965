"""DDP on CPU: the step time of ``qkov train --nproc 2`` (two gloo processes, one thread each)
against one process with one and with two threads, at the default 2-layer size. Each is timed at two run
lengths and the difference divided by the extra steps, so start-up (torchrun, imports, data) and
the final evaluation cancel out. On 2 cores no gain is expected: this measures the overhead.

    flock /tmp/qkov-heavy.lock python benchmarks/ddp_overhead.py
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed_run(steps: int, nproc: int, threads: int, out: Path, corpus: str | None) -> float:
    flags = ["--layers", "2", "--steps", str(steps), "--eval-every", "100000", "--evals-per-decade", "0"]
    flags += ["--checkpoint-every", "100000"]
    flags += ["--quiet", "--out", str(out), "--nproc", str(nproc), "--threads", str(threads)]
    flags += ["--corpus", corpus] if corpus else []
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "qkov", "train", *flags], check=True, capture_output=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="the extra steps of the longer run")
    parser.add_argument("--corpus", help="default: the standard library")
    parser.add_argument("--configs", default="1x1,2x1,1x2", help="PROCESSESxTHREADS, comma-separated")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="qkov-ddp-"))
    os.environ.setdefault("QKOV_CACHE", str(folder / "cache"))
    timed_run(1, 1, 1, folder / "warm", args.corpus)  # tokenizer and shards into the cache
    for config in args.configs.split(","):
        nproc, threads = map(int, config.split("x"))
        short = timed_run(10, nproc, threads, folder / f"{config}-short", args.corpus)
        long = timed_run(10 + args.steps, nproc, threads, folder / f"{config}-long", args.corpus)
        step = (long - short) / args.steps
        print(f"{nproc} process(es) x {threads} thread(s): {1000 * step:.1f} ms per step")


if __name__ == "__main__":
    main()
