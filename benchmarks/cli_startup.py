"""How fast the ``qkov`` command answers what needs no model: ``--version``, ``--help``, an argument
error and a mistyped path, each run ``--runs`` times as a fresh process (interleaved, so the
machine's load falls on all alike), beside ``python -c "import torch"`` (what every command paid
before it imported the library only when it runs) and ``python -c "pass"`` (the interpreter alone).
Prints the median and the slowest wall time of each.

    python benchmarks/cli_startup.py [--runs 7]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import time

CASES = {
    "qkov --version": ["-m", "qkov.cli", "--version"],
    "qkov --help": ["-m", "qkov.cli", "--help"],
    "qkov analyze --bogus": ["-m", "qkov.cli", "analyze", "--bogus"],
    "qkov analyze no/such/folder": ["-m", "qkov.cli", "analyze", "no/such/folder/x"],
    'python -c "import torch"': ["-c", "import torch"],
    'python -c "pass"': ["-c", "pass"],
}


def timed(args: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, *args], capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    runs = parser.parse_args().runs
    times: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(runs):
        for name, args in CASES.items():
            times[name].append(timed(args))
    where = platform.processor() or platform.machine()
    print(f"# {where}, Python {platform.python_version()}; {runs} runs each")
    print("| command | median (s) | slowest (s) |")
    print("|---|---|---|")
    for name, found in times.items():
        print(f"| `{name}` | {statistics.median(found):.2f} | {max(found):.2f} |")


if __name__ == "__main__":
    main()
