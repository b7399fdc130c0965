"""FactoredMatrix.topk (pruned where the bounds promise it pays, else streamed: qkov.topk) and
topk_per_row (streamed into preallocated outputs) against the exhaustive searches of the branch
point, side by side in one run, at 1 and 2 threads, on one 50257 x 50257 full circuit of rank 64
(one head's OV circuit at the paper's shape), for a trained-like and a flat spectrum; ``--sweep``
times the pruned and the streamed global search, each forced, on spectra between the two (what
``qkov.topk.LIVE_LIMIT`` is set from).

The exhaustive search is the code of commit ``BEFORE`` (``git show BEFORE:src/qkov/linalg.py``,
imported from a file). Spectra, built from Gaussian ``X [m, r]``, ``Y [n, r]`` and log-normal
norms ``alpha_i, beta_j = exp(0.5 N(0, 1))``:

- trained-like: ``A = diag(alpha) X diag(s^(1/2))``, ``B = diag(s^(1/2)) Y^T diag(beta)`` with
  ``s_i = i^-1.5`` (the product's singular values decay about as ``s``, its rows and columns have
  unequal norms, as trained embeddings do);
- flat: ``A = X``, ``B = Y^T`` with every row of ``X`` and of ``Y`` scaled to norm 1 (equal
  singular values in expectation, equal norms: nothing for a bound to prune, the adversarial case).

    flock /tmp/qkov-heavy.lock python benchmarks/topk.py            # about 6 minutes
    python benchmarks/topk.py --vocab 20000 --per-row-rows 4000      # a quicker look
    flock /tmp/qkov-heavy.lock python benchmarks/topk.py --vocab 20000 --sweep --threads 1
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import tempfile
import time
from pathlib import Path
from unittest.mock import patch

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


def counted(search, *args):
    """``(result, seconds, peak extra bytes, entries screened by pruning, streamed?)`` of
    ``search(*args)``."""
    count, screen, stream = 0, pruned._screen, pruned._streamed
    was_streamed = False

    def counting(s, rows, cols, *offset):
        nonlocal count
        count += (rows.stop - rows.start) * len(cols)
        return screen(s, rows, cols, *offset)

    def streaming(*a):
        nonlocal was_streamed
        was_streamed = True
        return stream(*a)

    pruned._screen, pruned._streamed = counting, streaming
    try:
        result, seconds, peak = measure(lambda: search(*args))
    finally:
        pruned._screen, pruned._streamed = screen, stream
    return result, seconds, peak, count, was_streamed


def best_of(repeats: int, *runs):
    """Each of ``runs`` (callables returning ``(result, seconds, peak, ...)``) ``repeats`` times,
    alternating, each with its fastest time and its largest peak."""
    found = [list(run()) for run in runs]
    for _ in range(repeats - 1):
        for got, run in zip(found, runs, strict=True):
            again = run()
            got[1], got[2] = min(got[1], again[1]), max(got[2], again[2])
    return found


def screened_in(screen: str, search):
    """``counted(search)`` with the screen in ``screen`` ("bfloat16" or "float32"), whatever
    ``qkov.topk._bf16_pays`` would choose here."""
    with patch.object(pruned, "_bf16_pays", lambda threads: screen == "bfloat16"):
        return counted(search)


def compare_topk(before, A, B, k: int, floor: float, repeats: int) -> None:
    """The exhaustive search against the new one screening in float32 and in bfloat16."""
    (old, t_old, m_old), *news = best_of(
        repeats,
        lambda: measure(lambda: before.FactoredMatrix(A, B).topk(k)),
        *(lambda s=s: screened_in(s, lambda: FactoredMatrix(A, B).topk(k)) for s in ("float32", "bfloat16")),
    )
    for screen, (new, t_new, m_new, count, streamed) in zip(("float32", "bfloat16"), news, strict=True):
        agree = torch.equal(old.rows * B.shape[1] + old.cols, new.rows * B.shape[1] + new.cols)
        diff = float((old.values.double() - new.values.double()).abs().max())
        how = "streamed" if streamed else f"pruned, screened {count / A.shape[0] / B.shape[1]:.4%}"
        print(
            f"  top-{k}: exhaustive {t_old:6.2f} s {m_old / 2**20:6.0f} MiB | new, {screen} screen "
            f"{t_new:6.2f} s {m_new / 2**20:5.0f} MiB | {t_old / t_new:5.2f}x; floor {floor:.2f} s; {how}; "
            f"same entries: {agree} (values within {diff:.1e})"
        )


def compare_per_row(before, A, B, k: int, rows: int, repeats: int) -> None:
    """Per-row top-k in float64 (as the skip-trigram search reads its circuits), first ``rows`` rows."""
    a, b = A[:rows].double(), B.double()
    ((v_old, c_old), t_old, m_old), ((v_new, c_new), t_new, m_new) = best_of(
        repeats,
        lambda: measure(lambda: before.FactoredMatrix(a, b).topk_per_row(k)),
        lambda: measure(lambda: FactoredMatrix(a, b).topk_per_row(k)),
    )
    print(
        f"  per-row top-{k}, float64, {rows} rows: exhaustive {t_old:6.2f} s {m_old / 2**20:6.0f} MiB | "
        f"new {t_new:6.2f} s {m_new / 2**20:5.0f} MiB | {t_old / t_new:5.2f}x; same columns and values: "
        f"{torch.equal(c_old, c_new) and torch.equal(v_old, v_new)}"
    )


def sweep(V: int, r: int, k: int) -> None:
    """Unit-norm Gaussian factors, singular values ``s_i = i^-e`` and log-normal norms
    ``exp(sigma N(0, 1))``: the pruned and the streamed search, each forced, and the choice made."""
    gen = torch.Generator().manual_seed(0)
    X, Y = torch.randn(V, r, generator=gen), torch.randn(V, r, generator=gen)
    X, Y = X / X.norm(dim=1, keepdim=True), Y / Y.norm(dim=1, keepdim=True)
    za, zb = torch.randn(V, 1, generator=gen), torch.randn(1, V, generator=gen)
    spectra = [(0, 0), (0, 0.25), (0, 0.3), (0, 0.4), (0.6, 0), (0.7, 0), (0.8, 0), (0.9, 0), (1.5, 0.5)]
    for e, sigma in spectra:
        root = torch.arange(1, r + 1, dtype=torch.float32) ** (-e / 2)
        A, B = (sigma * za).exp() * X * root, ((Y * root).mT * (sigma * zb).exp()).contiguous()
        times = {}
        for name, limit in (("pruned", torch.inf), ("streamed", -torch.inf), ("chosen", pruned.LIVE_LIMIT)):
            with patch.object(pruned, "LIVE_LIMIT", limit):
                _, times[name], _, count, streamed = counted(pruned.largest_entries, A, B, k, 128, 83)
            if name == "pruned":
                fraction = count / V / V
        print(
            f"  s_i = i^-{e}, sigma {sigma}: pruned screens {fraction:6.1%} {times['pruned']:5.2f} s | "
            f"streamed {times['streamed']:5.2f} s | {times['streamed'] / times['pruned']:4.2f}x | chosen: "
            f"{'streamed' if streamed else 'pruned'} {times['chosen']:5.2f} s"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--d-head", type=int, default=64)
    parser.add_argument("--k", type=int, default=100)
    parser.add_argument("--per-row-k", type=int, default=50)
    parser.add_argument("--per-row-rows", type=int, default=8192)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=2, help="alternating runs; the fastest is shown")
    parser.add_argument("--sweep", action="store_true")
    args = parser.parse_args()
    V, r = args.vocab, args.d_head
    before = exhaustive_module()
    for threads in args.threads:
        torch.set_num_threads(threads)
        rate = matmul_rate(V, r)
        floor = 2 * V * V * r / rate / 1e9
        print(
            f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average "
            f"{os.getloadavg()[0]:.1f}; fp32 matmul {rate:.0f} GFLOP/s (128 x {r} x {V}); "
            f"exhaustive floor {floor:.2f} s"
        )
        if args.sweep:
            sweep(V, r, args.k)
            continue
        for kind in ("trained-like", "flat"):
            A, B = factors(kind, V, V, r)
            print(kind)
            compare_topk(before, A, B, args.k, floor, args.repeats)
            compare_per_row(before, A, B, args.per_row_k, min(args.per_row_rows, V), args.repeats)
    print(f"fp32 matmul afterwards: {matmul_rate(V, r):.0f} GFLOP/s, load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
