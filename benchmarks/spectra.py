"""Every head's full-vocabulary spectra and direct copying measures at GPT-2 small shapes (12 x 12
heads, d_model 768, d_head 64, d_vocab 50257, random weights), qkov beside TransformerLens 3.x in
one run, 1 thread.

1. All full OV circuits ``W_E W_V W_O W_U``: norm, singular values, eigenvalues and copying scores,
   the circuit's construction included. qkov: shared outer factors (a root of the Gram matrix of
   ``W_E`` and of ``W_U^T``, formed in float64); TransformerLens: ``W_E @ FactoredMatrix(W_V, W_O) @
   W_U`` (``[heads, 50257, 64]`` factors), then ``.S``, ``.norm()``, ``.eigenvalues``. 2. The same
   for the full QK circuits.
3. The diagonal and its z-scores for every head, against the machine's fp32 matmul rate measured
   in the same run (the floor is building ``W_E W_V`` and ``W_O W_U``). 4. ``self_top1`` exact for
   one head and sampled for every head. 5. The random baselines behind ``compare_copying``'s rule.

    flock /tmp/qkov-heavy.lock python benchmarks/spectra.py                 # TL on 2 of 12 layers
    flock /tmp/qkov-heavy.lock python benchmarks/spectra.py --tl-layers 12  # TL on all (7 GiB)

TransformerLens's side is measured on ``--tl-layers`` layers and scaled to all (its time and
memory grow linearly with the number of heads; the script says so when it scales).
"""

from __future__ import annotations

import argparse
import warnings

import torch

import qkov
from qkov.circuits.copying import diagonal_and_ranks, random_copying_scores
from qkov.circuits.qk_ov import shared_full_ov_circuit, shared_full_qk_circuit, stacked_weights
from qkov.linalg import eigenvalue_positivity
from qkov.machine import matmul_rate

from peak_memory import measure

MIB = 2**20


def rated(fn):
    """``measure(fn)`` plus the fp32 matmul rate measured just before and just after it (the mean):
    on a shared machine the rate moves, so every figure comes with the rate it ran at."""
    before = matmul_rate(torch.float32, 1024)
    result, seconds, peak = measure(fn)
    return result, seconds, peak, (before + matmul_rate(torch.float32, 1024)) / 2


def gpt2_shaped(layers: int, heads: int, d_model: int, d_head: int, d_vocab: int) -> qkov.AttnOnlyTransformer:
    """Random weights at the given shapes (no positions: they are not part of these circuits)."""
    cfg = qkov.Config(
        n_layers=layers,
        n_heads=heads,
        d_model=d_model,
        d_head=d_head,
        d_vocab=d_vocab,
        n_ctx=8,
        positional_embedding="none",
    )
    model = qkov.AttnOnlyTransformer(cfg)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=gen) / param.shape[-2] ** 0.5)
    return model.requires_grad_(False)


def all_four(full) -> tuple:
    """Norm, singular values, eigenvalues and copying scores of a qkov SharedFactoredMatrix."""
    eigenvalues = full.eigenvalues()
    return full.norm(), full.singular_values(), eigenvalues, eigenvalue_positivity(eigenvalues)


def tl_all_four(W_left, W_A, W_B, W_right) -> tuple:
    """The same with TransformerLens, its circuit built as a user would."""
    from transformer_lens import FactoredMatrix as TLFactoredMatrix

    full = W_left @ TLFactoredMatrix(W_A, W_B) @ W_right
    S, norm, eigenvalues = full.S, full.norm(), full.eigenvalues
    score = eigenvalues.real.sum(-1) / eigenvalues.abs().sum(-1)
    return norm, S, eigenvalues, score


def warm_up() -> None:
    """First calls (library loading, kernel selection) outside the measurements, for both."""
    small = gpt2_shaped(1, 2, 16, 4, 50)
    for circuit in ("OV", "QK"):
        qkov.head_spectra(small, circuit)
    all_four(shared_full_ov_circuit(small))
    W_V, W_O = stacked_weights(small, "W_V"), stacked_weights(small, "W_O")
    tl_all_four(small.W_E, W_V, W_O, small.W_U)


def spectra(model: qkov.AttnOnlyTransformer, circuit: str, tl_layers: int) -> None:
    n_heads = model.cfg.n_layers * model.cfg.n_heads
    W = {name: stacked_weights(model, name)[:tl_layers] for name in ("W_Q", "W_K", "W_V", "W_O")}
    if circuit == "OV":
        shared = shared_full_ov_circuit
        tl_args = (model.W_E, W["W_V"], W["W_O"], model.W_U)
    else:
        shared = shared_full_qk_circuit
        tl_args = (model.W_E, W["W_Q"] * model.cfg.d_head**-0.5, W["W_K"].mT, model.W_E.mT)
    ours, t_ours, m_ours, r_ours = rated(lambda: all_four(shared(model)))
    rows, t_rows, m_rows, r_rows = rated(lambda: qkov.head_spectra(model, circuit, k=10))
    theirs, t_tl, m_tl, r_tl = rated(lambda: tl_all_four(*tl_args))
    scale = n_heads / (tl_layers * model.cfg.n_heads)
    print(f"\n## All {n_heads} full {circuit} circuits: norm, singular values, eigenvalues, copying scores")
    meanwhile = "GFLOP/s matmul rate meanwhile"
    print(
        f"qkov (shared factors, construction included)  {t_ours:7.2f} s  {m_ours / MIB:7.0f} MiB peak", end=""
    )
    print(f"  {r_ours / 1e9:4.0f} {meanwhile}")
    print(
        f"qkov head_spectra(model, {circuit!r}, k=10)          {t_rows:7.2f} s  {m_rows / MIB:7.0f} MiB peak",
        end="",
    )
    print(f"  {r_rows / 1e9:4.0f} {meanwhile}")
    measured = f"measured on {tl_layers * model.cfg.n_heads} heads"
    print(
        f"TransformerLens, {measured}: {t_tl:.2f} s, {m_tl / MIB:.0f} MiB peak, {r_tl / 1e9:.0f} {meanwhile}"
    )
    if scale != 1:
        print(
            f"TransformerLens scaled x{scale:g} to {n_heads} heads   "
            f"{t_tl * scale:7.2f} s  {m_tl * scale / MIB:7.0f} MiB"
        )
    print(f"speed-up {t_tl * scale / t_ours:.1f}x, memory {m_tl * scale / max(m_ours, 1):.1f}x less")
    k = tl_layers
    norm_diff = ((ours[0][:k] - theirs[0]).abs() / theirs[0]).max()
    sv_diff = ((ours[1][:k, ..., :10] - theirs[1][..., :10]).abs() / theirs[1][..., :1]).max()
    print(
        f"agreement with TransformerLens (float32): norms {norm_diff:.1e}, "
        f"top-10 singular values {sv_diff:.1e}",
        end="",
    )
    if circuit == "OV":
        print(f", copying scores {float((ours[3][:k] - theirs[3]).abs().max()):.1e}")
    else:
        print()


def diagonal(model: qkov.AttnOnlyTransformer) -> None:
    cfg = model.cfg
    ov = shared_full_ov_circuit(model)
    (mean, z, _), t, m, rate = rated(lambda: diagonal_and_ranks(ov, torch.arange(0), torch.device("cpu")))
    heads_width = cfg.n_layers * cfg.n_heads * cfg.d_head
    floor = 2 * 2 * cfg.d_vocab * cfg.d_model * heads_width  # W_E W_V and W_O W_U, every head
    print(f"\n## Diagonal and z-scores of all {cfg.n_layers * cfg.n_heads} full OV circuits")
    print(
        f"qkov: {t:.2f} s, {m / MIB:.0f} MiB peak; "
        f"the floor, building W_E W_V and W_O W_U: {floor / 1e12:.2f} TFLOP"
    )
    print(
        f"= {floor / t / 1e9:.0f} GFLOP/s, {floor / t / rate:.0%} of the measured matmul rate "
        f"({rate / 1e9:.0f} GFLOP/s)"
    )
    print(f"random heads' mean diagonal z: max |z| {float(z.abs().max()):.3f} over the heads")
    print("TransformerLens: no diagonal or row statistics (the [heads, 50257, 64] factors first, as above)")


def one_head(model: qkov.AttnOnlyTransformer, layer: int, head: int) -> qkov.AttnOnlyTransformer:
    """A one-layer, one-head model with ``model``'s embeddings and that head's weights."""
    cfg = model.cfg
    single = gpt2_shaped(1, 1, cfg.d_model, cfg.d_head, cfg.d_vocab)
    with torch.no_grad():
        single.W_E.copy_(model.W_E)
        single.W_U.copy_(model.W_U)
        for name in ("W_Q", "W_K", "W_V", "W_O"):
            getattr(single.blocks[0].attn, name).copy_(
                getattr(model.blocks[layer].attn, name)[head : head + 1]
            )
    return single


def self_top1(model: qkov.AttnOnlyTransformer, sample_rows: int) -> None:
    cfg = model.cfg
    print("\n## self_top1 (the token's own logit the strict maximum of its row)")
    single = one_head(model, 0, 0)
    exact, t, m, rate = rated(lambda: qkov.direct_copying(single, progress=False))
    flops = 2 * cfg.d_vocab**2 * cfg.d_head
    print(
        f"one head, exact (all {cfg.d_vocab} rows): {t:.2f} s, {m / MIB:.0f} MiB peak, "
        f"{flops / t / rate:.0%} of the matmul rate; self_top1 {exact[0].self_top1:.5f}"
    )
    gen = torch.Generator().manual_seed(0)
    sampled, t, m, rate = rated(
        lambda: qkov.direct_copying(model, sample_rows, generator=gen, progress=False)
    )
    print(
        f"all {len(sampled)} heads, {sample_rows} sampled rows each: {t:.2f} s, {m / MIB:.0f} MiB peak, "
        f"{rate / 1e9:.0f} GFLOP/s matmul rate meanwhile"
    )
    low, high = sampled[0].self_top1_ci
    print(f"L0H0 sampled: self_top1 {sampled[0].self_top1:.4f}, 95% CI [{low:.4f}, {high:.4f}]")
    heads = len(sampled)
    print(
        f"all {heads} heads exact would be {heads * flops / 1e12:.1f} TFLOP: "
        f"~{heads * flops / rate / 60:.0f} min here at the matmul rate"
    )


def baselines() -> None:
    """The numbers behind compare_copying's thresholds (random Gaussian heads)."""
    print("\n## Random baselines for compare_copying's thresholds")
    for d_head in (16, 64):
        fm = qkov.FactoredMatrix(torch.zeros(4096, d_head), torch.zeros(d_head, 4096))
        scores = random_copying_scores(fm, 200, torch.Generator().manual_seed(0))
        print(
            f"copying score of random heads, d_vocab 4096, d_head {d_head}: "
            f"99th percentile {float(scores.quantile(0.99)):.3f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--d-model", type=int, default=768)
    parser.add_argument("--d-head", type=int, default=64)
    parser.add_argument("--tl-layers", type=int, default=2, help="layers TransformerLens is measured on")
    parser.add_argument("--sample-rows", type=int, default=500)
    parser.add_argument("--spectra-only", action="store_true", help="the OV and QK tables alone")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    model = gpt2_shaped(args.layers, args.heads, args.d_model, args.d_head, args.vocab)
    print(
        f"torch {torch.__version__}, 1 thread; {args.layers} x {args.heads} heads, d_model {args.d_model}, "
        f"d_head {args.d_head}, d_vocab {args.vocab}"
    )
    with torch.no_grad():
        warm_up()
        spectra(model, "OV", min(args.tl_layers, args.layers))
        spectra(model, "QK", min(args.tl_layers, args.layers))
        if args.spectra_only:
            return
        diagonal(model)
        self_top1(model, args.sample_rows)
        baselines()


if __name__ == "__main__":
    main()
