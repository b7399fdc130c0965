"""qkov's FactoredMatrix against TransformerLens 3.x FactoredMatrix, side by side in one run.

1. Speed and memory at GPT-2 small shapes (d_vocab 50257, d_model 768, d_head 64, 12 layers x 12
   heads, random weights): the full OV circuit ``W_E W_V W_O W_U`` of all 144 heads, then its
   eigenvalues, SVD, Frobenius norm and copying scores; and the top-100 entries of one head's full
   50257 x 50257 OV circuit (TransformerLens has no equivalent short of the 10 GB dense product).
2. Correctness: both libraries against dense float64 at small shapes.

    python benchmarks/factored.py                 # everything (about 6 GB of memory at peak)
    python benchmarks/factored.py --heads 2 --layers 2   # a quicker look
"""

from __future__ import annotations

import argparse
import warnings

import numpy as np
import torch

import qkov
from qkov import FactoredMatrix

from peak_memory import measure


def tl_factored():
    from transformer_lens import FactoredMatrix as TLFactoredMatrix

    return TLFactoredMatrix


def tl_svd(fm):
    """TransformerLens returns (U, S, V) with U diag(S) V^T = AB (its name for V was once Vh)."""
    U, S, V = fm.svd()
    return U, S, V.mT


def tl_copying_score(fm):
    eigenvalues = fm.eigenvalues
    total = eigenvalues.abs().sum(-1)
    return eigenvalues.real.sum(-1) / total


def speed(args: argparse.Namespace) -> None:
    torch.manual_seed(0)
    L, H, V, D, E = args.layers, args.heads, args.vocab, args.d_model, args.d_head
    W_E = torch.randn(V, D) / D**0.5
    W_U = torch.randn(D, V) / D**0.5
    W_V = torch.randn(L, H, D, E) / D**0.5
    W_O = torch.randn(L, H, E, D) / E**0.5
    TL = tl_factored()
    print(f"## Full OV circuits W_E W_V W_O W_U: {L} x {H} heads, d_vocab {V}, d_model {D}, d_head {E}")
    print(f"{'operation':<28}{'qkov s':>9}{'TL s':>9}{'TL/qkov':>9}{'qkov MiB':>10}{'TL MiB':>9}")
    ours, t_ours, m_ours = measure(lambda: W_E @ FactoredMatrix(W_V, W_O) @ W_U)
    theirs, t_theirs, m_theirs = measure(lambda: W_E @ TL(W_V, W_O) @ W_U)
    row("build the OV circuits", t_ours, t_theirs, m_ours, m_theirs)
    operations = [
        ("eigenvalues", lambda: ours.eigenvalues(), lambda: theirs.eigenvalues),
        ("SVD", lambda: ours.svd(), lambda: TL(theirs.A, theirs.B).svd()),
        ("Frobenius norm", lambda: ours.norm(), lambda: TL(theirs.A, theirs.B).norm()),
        (
            "copying scores",
            lambda: qkov.copying_score(ours),
            lambda: tl_copying_score(TL(theirs.A, theirs.B)),
        ),
    ]
    results = {}
    for name, ours_fn, theirs_fn in operations:  # fresh TL objects: no cached SVD is reused
        a, t_a, m_a = measure(ours_fn)
        b, t_b, m_b = measure(theirs_fn)
        results[name] = (a, b)
        row(name, t_a, t_b, m_a, m_b)
        del a, b
    norm_ours, norm_theirs = results["Frobenius norm"]
    print(f"norms agree to {float(((norm_ours - norm_theirs).abs() / norm_ours).max()):.1e} (relative)")
    copy_ours, copy_theirs = results["copying scores"]
    print(f"copying scores agree to {float((copy_ours - copy_theirs).abs().max()):.1e}")
    del results, theirs

    head = ours[0, 0]
    top, t_top, m_top = measure(lambda: head.topk(100))
    print(f"\n## Top-100 entries of one head's {V} x {V} OV circuit ({V * V / 1e9:.2f} billion entries)")
    print(f"qkov: {t_top:.2f} s, {m_top / 2**20:.0f} MiB peak extra (1 GiB block budget)")
    print(f"TransformerLens: no top-k; the dense product (.AB) alone needs {V * V * 4 / 2**30:.1f} GiB")
    check_rows = top.rows[:5]
    exact = head.A[check_rows] @ head.B  # spot-check: the best entries against their dense rows
    assert torch.allclose(exact.gather(1, top.cols[:5, None])[:, 0], top.values[:5])
    print(f"largest entry {float(top.values[0]):.3f} at (row {int(top.rows[0])}, col {int(top.cols[0])})")


def row(name, t_ours, t_theirs, m_ours, m_theirs):
    mib = 2**20
    ratio = t_theirs / t_ours
    print(f"{name:<28}{t_ours:9.2f}{t_theirs:9.2f}{ratio:8.1f}x{m_ours / mib:10.0f}{m_theirs / mib:9.0f}")


def correctness() -> None:
    """Both libraries against dense float64 on small random products, including the shapes where
    shortcuts go wrong: r > min(m, n), rank-deficient factors, batches."""
    TL = tl_factored()
    gen = torch.Generator().manual_seed(0)
    cases = {
        "generic 40x6x40": (torch.randn(3, 40, 6, generator=gen), torch.randn(3, 6, 40, generator=gen)),
        "inner > rows 5x9x5": (torch.randn(5, 9, generator=gen), torch.randn(9, 5, generator=gen)),
        "rectangular 30x4x20": (torch.randn(30, 4, generator=gen), torch.randn(4, 20, generator=gen)),
        "inner 2, batch 3x5x2x5": (torch.randn(3, 5, 2, generator=gen), torch.randn(3, 2, 5, generator=gen)),
        "rank-deficient A": (
            torch.randn(30, 1, generator=gen) @ torch.ones(1, 6),
            torch.randn(6, 30, generator=gen),
        ),
    }
    print("\n## Agreement with dense float64 (max relative error)")
    print(f"{'case':<24}{'quantity':<24}{'qkov':>10}  TL")
    for case, (A, B) in cases.items():
        A, B = A.double(), B.double()
        dense = (A @ B).numpy()
        ours, theirs = FactoredMatrix(A, B), TL(A, B)
        scale = np.linalg.norm(dense, axis=(-2, -1))
        norm_dense = scale
        report(case, "Frobenius norm", ours.norm().numpy(), theirs.norm().numpy(), norm_dense, scale)
        U, S, Vh = ours.svd()
        tU, tS, tVh = tl_svd(theirs)
        report(
            case,
            "SVD reconstruction",
            (U * S[..., None, :] @ Vh).numpy(),
            (tU * tS[..., None, :] @ tVh).numpy(),
            dense,
            scale,
        )
        k = min(dense.shape[-2:])
        sv = np.linalg.svd(dense, compute_uv=False)
        report(case, "singular values", pad(S.numpy(), k), pad(tS.numpy(), k), sv, scale)
        if dense.shape[-1] == dense.shape[-2]:
            for p in (1, 2):
                expected = np.trace(np.linalg.matrix_power(dense, p), axis1=-2, axis2=-1)
                report(
                    case,
                    f"sum eigenvalues^{p}",
                    (ours.eigenvalues().numpy() ** p).sum(-1).real,
                    (theirs.eigenvalues.numpy() ** p).sum(-1).real,
                    expected,
                    scale**p,
                )
        rows = [0, 1]
        explicit = (slice(None),) * (A.ndim - 2) + (rows,)
        report(
            case,
            "fm[..., [0, 1], :]",
            ours[..., rows, :].AB.numpy(),
            attempt(theirs, (..., rows, slice(None))),
            dense[..., rows, :],
            scale,
        )
        report(
            case,
            "fm[:, [0, 1]] (no ...)",
            ours[explicit].AB.numpy(),
            attempt(theirs, explicit),
            dense[..., rows, :],
            scale,
        )


def attempt(fm, key):
    """TransformerLens' ``fm[key]`` as a dense array, or the name of the exception it raised."""
    try:
        return fm[key].AB.numpy()
    except Exception as err:  # noqa: BLE001 - reported, not hidden
        return f"{type(err).__name__}"


def pad(values: np.ndarray, k: int) -> np.ndarray:
    """Singular values, cut or zero-padded to k per matrix."""
    out = np.zeros((*values.shape[:-1], k))
    n = min(k, values.shape[-1])
    out[..., :n] = values[..., :n]
    return out


def report(case, quantity, ours, theirs, expected, scale):
    def err(x):
        if isinstance(x, str):
            return x  # the exception raised
        if np.shape(x) != np.shape(expected):
            return f"shape {np.shape(x)}"  # a silently wrong answer
        x = np.asarray(x, dtype=np.float64)
        s = np.asarray(scale)
        s = s.reshape(s.shape + (1,) * (np.ndim(expected) - np.ndim(s)))
        return f"{float(np.max(np.abs(x - expected) / np.maximum(s, 1e-300))):.1e}"

    print(f"{case:<24}{quantity:<24}{err(ours):>10}  {err(theirs)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--d-model", type=int, default=768)
    parser.add_argument("--d-head", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    correctness()
    print()
    speed(args)


if __name__ == "__main__":
    main()
