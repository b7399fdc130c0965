"""The pruned top-k search (qkov.topk) against the exhaustive streamed search it replaced, side by
side in one run, on one 50257 x 50257 full circuit of rank 64 (one head's OV circuit at the
paper's shape), for a trained-like and a flat spectrum.

The exhaustive search is the code of commit ``BEFORE`` (``git show BEFORE:src/qkov/linalg.py``,
imported from a file). Spectra, built from Gaussian ``X [m, r]``, ``Y [n, r]`` and log-normal
norms ``alpha_i, beta_j = exp(0.5 N(0, 1))``:

- trained-like: ``A = diag(alpha) X diag(s^(1/2))``, ``B = diag(s^(1/2)) Y^T diag(beta)`` with
  ``s_i = i^-1.5`` (the product's singular values decay about as ``s``, its rows and columns have
  unequal norms, as trained embeddings do);
- flat: ``A = X``, ``B = Y^T`` with every row of ``X`` and of ``Y`` scaled to norm 1 (equal
  singular values in expectation, equal norms: nothing for a bound to prune, the adversarial case).

    flock /tmp/qkov-heavy.lock python benchmarks/topk.py            # about 2 minutes
    python benchmarks/topk.py --vocab 20000 --per-row-rows 4000      # a quicker look
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from qkov import FactoredMatrix
from qkov import topk as pruned

from peak_memory import measure

BEFORE = "970ef06"  # the branch point: the exhaustive search
ROOT = Path(__file__).resolve().parents[1]


def exhaustive_module():
    """``qkov.linalg`` as of ``BEFORE``, imported from a temporary file."""
    source = subprocess.run(
        ["git", "show", f"{BEFORE}:src/qkov/linalg.py"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    path = Path(tempfile.mkdtemp()) / "linalg_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("linalg_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def factors(kind: str, m: int, n: int, r: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    X, Y = torch.randn(m, r, generator=gen), torch.randn(n, r, generator=gen)
    if kind == "flat":
        return X / X.norm(dim=1, keepdim=True), (Y / Y.norm(dim=1, keepdim=True)).mT.contiguous()
    root = torch.arange(1, r + 1, dtype=torch.float32) ** -0.75
    alpha = (0.5 * torch.randn(m, 1, generator=gen)).exp()
    beta = (0.5 * torch.randn(1, n, generator=gen)).exp()
    return alpha * X * root, ((Y * root).mT * beta).contiguous()


def matmul_rate(n: int, r: int) -> float:
    """fp32 GFLOP/s of the exhaustive search's own product: 128 rows x r x n."""
    a, b = torch.randn(128, r), torch.randn(r, n)
    out = torch.empty(128, n)
    torch.matmul(a, b, out=out)
    started, repeats = time.perf_counter(), 50
    for _ in range(repeats):
        torch.matmul(a, b, out=out)
    return 2 * 128 * r * n * repeats / (time.perf_counter() - started) / 1e9


def screened(search, *args):
    """``(result, seconds, peak extra bytes, entries screened)`` of ``search(*args)``."""
    count = 0
    screen = pruned._screen

    def counted(s, rows, cols, *offset):
        nonlocal count
        count += (rows.stop - rows.start) * len(cols)
        return screen(s, rows, cols, *offset)

    pruned._screen = counted
    try:
        result, seconds, peak = measure(lambda: search(*args))
    finally:
        pruned._screen = screen
    return result, seconds, peak, count


def compare_topk(before, A, B, k: int, floor: float) -> None:
    old, t_old, m_old = measure(lambda: before.FactoredMatrix(A, B).topk(k))
    (values, index), t_new, m_new, count = screened(pruned.largest_entries, A, B, k)
    new = FactoredMatrix(A, B).topk(k)  # the public method: the same search, checked to agree
    same = torch.equal(new.rows * B.shape[1] + new.cols, index)
    agree = torch.equal(old.rows * B.shape[1] + old.cols, index)
    diff = float((old.values.double() - values).abs().max())
    print(
        f"  top-{k}: exhaustive {t_old:6.2f} s {m_old / 2**20:6.0f} MiB | pruned {t_new:6.2f} s "
        f"{m_new / 2**20:5.0f} MiB | {t_old / t_new:5.1f}x; floor {floor:.2f} s; screened "
        f"{count / A.shape[0] / B.shape[1]:.4%}; same entries: {agree} (values within {diff:.1e}), "
        f"FactoredMatrix.topk: {same}"
    )


def compare_per_row(before, A, B, k: int, rows: int, floor: float) -> None:
    """Per-row top-k in float64 (as the skip-trigram search reads its circuits), first ``rows`` rows."""
    a, b = A[:rows].double(), B.double()
    (v_old, c_old), t_old, m_old = measure(lambda: before.FactoredMatrix(a, b).topk_per_row(k))
    (v_new, c_new), t_new, m_new, count = screened(pruned.largest_per_row, a, b, k)
    agree = torch.equal(c_old, c_new)
    diff = float((v_old - v_new).abs().max())
    print(
        f"  per-row top-{k}, float64, {rows} rows: exhaustive {t_old:6.2f} s {m_old / 2**20:6.0f} MiB | "
        f"pruned {t_new:6.2f} s {m_new / 2**20:5.0f} MiB | {t_old / t_new:5.1f}x; fp32 floor "
        f"{floor * rows / A.shape[0]:.2f} s; screened {count / rows / B.shape[1]:.2%}; same columns: "
        f"{agree} (values within {diff:.1e})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--d-head", type=int, default=64)
    parser.add_argument("--k", type=int, default=100)
    parser.add_argument("--per-row-k", type=int, default=50)
    parser.add_argument("--per-row-rows", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    V, r = args.vocab, args.d_head
    rate = matmul_rate(V, r)
    floor = 2 * V * V * r / rate / 1e9
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average "
        f"{os.getloadavg()[0]:.1f}; fp32 matmul {rate:.0f} GFLOP/s (128 x {r} x {V})"
    )
    print(f"one {V} x {V} circuit of rank {r}: the exhaustive floor at this rate is {floor:.2f} s")
    before = exhaustive_module()
    for kind in ("trained-like", "flat"):
        A, B = factors(kind, V, V, r)
        print(kind)
        compare_topk(before, A, B, args.k, floor)
        compare_per_row(before, A, B, args.per_row_k, min(args.per_row_rows, V), floor)
    print(f"fp32 matmul afterwards: {matmul_rate(V, r):.0f} GFLOP/s, load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
