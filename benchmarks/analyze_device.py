"""``qkov analyze`` on a GPU beside the CPU: both runs timed, and every number of the two
``results.json`` compared. A GPT-2-small-shaped qkov model (12 layers x 12 heads, d_model 768,
d_mlp 3072, GELU, LayerNorm as an imported GPT-2 has it after folding, 50257 tokens; qkov's own
random initialisation, so nothing is downloaded and only torch is needed) is analysed with
``--device DEVICE`` and with ``--device cpu``, each in a fresh process (``qkov analyze``).

The results should be the same numbers to float rounding (the random inputs are drawn on the CPU
and moved), but for direct copying, which is exact on a GPU where the CPU samples rows: for it the
script counts the heads whose CPU 95% interval holds the GPU's exact ``self_top1``. Every other
number is compared leaf by leaf; the script prints, per ``Results`` field, the largest absolute and
relative differences and any leaf that is not a number and differs (a head name, a token).

    python benchmarks/analyze_device.py                       # cuda against the CPU
    python benchmarks/analyze_device.py --layers 2            # a quicker look
    python benchmarks/analyze_device.py --device cpu --threads 1   # its CPU form: 1 thread against all
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import qkov
from qkov.machine import compute_device


def gpt2_small_shaped(layers: int, n_ctx: int) -> qkov.Transformer:
    cfg = qkov.Config(layers, 12, 768, 64, 50257, n_ctx, "standard", "LNPre", d_mlp=3072, act_fn="gelu_new")
    return qkov.Transformer(cfg, biases=True)


def run_analyze(checkpoint: Path, out: Path, device: str, threads: int) -> float:
    """``qkov analyze`` in a fresh process; its wall seconds (loading and writing included)."""
    command = [sys.executable, "-m", "qkov", "analyze", str(checkpoint), "--out", str(out)]
    command += ["--device", device, "--threads", str(threads), "--quiet"]
    started = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, text=True)
    return time.perf_counter() - started


def leaves(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """Every number, string, bool and None in a results tree, with its path."""
    if dataclasses.is_dataclass(value):
        for f in dataclasses.fields(value):
            yield from leaves(getattr(value, f.name), f"{path}.{f.name}")
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from leaves(item, f"{path}[{key}]")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from leaves(item, f"{path}[{i}]")
    else:
        yield path, value


def compare(expected: qkov.Results, got: qkov.Results) -> None:
    """Per ``Results`` field: the largest absolute difference of its numbers, and the other leaves
    that differ (at most three shown). Direct copying too when both runs scored the same rows."""
    skip = {"schema_version", "config", "tokens", "training", "phase_change"}
    if exactness(expected) != exactness(got):
        skip.add("copying_direct")
        print(f"  {'copying_direct':22s} {copying_intervals(expected, got)}")
    for field in dataclasses.fields(expected):
        if field.name in skip:
            continue
        a = list(leaves(getattr(expected, field.name)))
        b = list(leaves(getattr(got, field.name)))
        if [p for p, _ in a] != [p for p, _ in b]:
            print(f"  {field.name:22s} a different shape: {len(a)} against {len(b)} leaves")
            continue
        largest, relative, others = 0.0, 0.0, []
        for (path, x), (_, y) in zip(a, b, strict=True):
            numbers = isinstance(x, float | int) and isinstance(y, float | int) and not isinstance(x, bool)
            if numbers and math.isfinite(x) and math.isfinite(y):
                largest = max(largest, abs(x - y))
                relative = max(relative, abs(x - y) / max(abs(x), abs(y), 1e-30))
            elif x != y:
                others.append(f"{path}: {x!r} / {y!r}")
        line = f"  {field.name:22s} {len(a):7d} leaves, largest difference {largest:.2e}"
        line += f", {relative:.2e} relative"
        print(line + (f"; {len(others)} other leaves differ: {others[:3]}" if others else ""))


def exactness(results: qkov.Results) -> bool | None:
    return None if not results.copying_direct else results.copying_direct[0].exact


def copying_intervals(sampled: qkov.Results, exact: qkov.Results) -> str:
    """How often the sampled run's 95% interval holds the exact run's ``self_top1``."""
    pairs = list(zip(sampled.copying_direct, exact.copying_direct, strict=True))
    inside = sum(s.self_top1_ci[0] <= e.self_top1 <= s.self_top1_ci[1] for s, e in pairs)
    rows = pairs[0][0].rows
    return f"the CPU's {rows}-row 95% interval holds the exact self_top1 for {inside} of {len(pairs)} heads"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--n-ctx", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="CPU threads of the --device run")
    args = parser.parse_args()
    compute_device(args.device)  # one line, before any work, when it is not here
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        qkov.save(gpt2_small_shaped(args.layers, args.n_ctx), folder / "qkov")
        print(f"random GPT-2: {args.layers} layers x 12 heads, d_model 768, 50257 tokens, n_ctx {args.n_ctx}")
        seconds = run_analyze(folder / "qkov", folder / "device", args.device, args.threads)
        cpu_seconds = run_analyze(folder / "qkov", folder / "cpu", "cpu", os.cpu_count() or 1)
        print(
            f"qkov analyze --device {args.device} ({args.threads} threads): {seconds:.1f} s; "
            f"--device cpu ({os.cpu_count()} threads): {cpu_seconds:.1f} s; ratio {cpu_seconds / seconds:.2f}"
        )
        on_device, on_cpu = (qkov.load_results(folder / name / "results.json") for name in ("device", "cpu"))
        compare(on_cpu, on_device)


if __name__ == "__main__":
    main()
