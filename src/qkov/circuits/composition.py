"""Q-, K- and V-composition between heads of different layers (section "Three Kinds of
Composition"), and the token-level K-composition term behind induction heads.

A later head ``h2`` can read what an earlier head ``h1`` wrote through its queries, keys or
values. The paper measures how much with (column vectors, ``W_QK = W_Q^T W_K``, ``W_OV = W_O W_V``)

- Q: ``‖W_QK^h2T W_OV^h1‖_F / (‖W_QK^h2‖_F ‖W_OV^h1‖_F)``
- K: ``‖W_QK^h2  W_OV^h1‖_F / (‖W_QK^h2‖_F ‖W_OV^h1‖_F)``
- V: ``‖W_OV^h2  W_OV^h1‖_F / (‖W_OV^h2‖_F ‖W_OV^h1‖_F)``

In qkov's row-vector form (``qk = W_Q W_K^T``, ``ov = W_V W_O``) the numerators are
``‖ov1 qk2‖``, ``‖ov1 qk2^T‖`` and ``‖ov1 ov2‖`` (each the transpose of the paper's product).

Computed small: with ``W_V1 = Q R_V1`` (thin QR), ``‖W_V1 W_O1 W_Q2 W_K2^T‖ = ‖R_V1 W_O1 W_Q2 R_K2^T‖``,
a ``d_head x d_head`` matrix per pair, so all pairs of a 144-head model take one batched product
of ``[d_head, d_model] @ [d_model, d_head]`` per layer pair.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch
from einops import rearrange
from jaxtyping import Float
from torch import Tensor

from qkov.circuits.qk_ov import ov_circuit, qk_circuit, stacked_weights
from qkov.errors import QkovError
from qkov.linalg import FactoredMatrix, copying_score
from qkov.model import AttnOnlyTransformer
from qkov.names import parse_head

KINDS = ("Q", "K", "V")
BASELINE_SAMPLES = 100


def _r_factor(X: Float[Tensor, "... d_model d_head"]) -> Float[Tensor, "... d_head d_head"]:
    """``R`` of the thin QR ``X = Q R``: since ``Q`` has orthonormal columns, ``‖X Z‖_F = ‖R Z‖_F``
    for any ``Z``."""
    return torch.linalg.qr(X, mode="r").R


def _left_right(model: AttnOnlyTransformer, kind: str) -> tuple[Tensor, Tensor]:
    """``left [n_layers, n_heads, d_head, d_model]`` and ``right [n_layers, n_heads, d_model,
    d_head]`` such that the raw numerator for ``h1 -> h2`` is ``‖left[h1] @ right[h2]‖_F``."""
    W_Q, W_K, W_V, W_O = (stacked_weights(model, name).detach() for name in ("W_Q", "W_K", "W_V", "W_O"))
    left = _r_factor(W_V) @ W_O  # ‖W_V1 W_O1 Z‖ = ‖R_V1 W_O1 Z‖
    if kind == "Q":  # ‖ov1 W_Q2 W_K2^T‖ = ‖ov1 W_Q2 R_K2^T‖
        right = W_Q @ _r_factor(W_K).mT
    elif kind == "K":  # ‖ov1 W_K2 W_Q2^T‖
        right = W_K @ _r_factor(W_Q).mT
    else:  # ‖ov1 W_V2 W_O2‖ = ‖ov1 W_V2 R_O2^T‖ with W_O2^T = Q R_O2
        right = W_V @ _r_factor(W_O.mT).mT
    return left, right


def raw_composition_scores(
    model: AttnOnlyTransformer, kind: str
) -> Float[Tensor, "layer_from head_from layer_to head_to"]:
    """The paper's composition score without a baseline; NaN where ``layer_from >= layer_to``."""
    if kind not in KINDS:
        raise QkovError(f"composition kind must be one of Q, K, V, got {kind!r}")
    cfg = model.cfg
    with torch.no_grad():
        left, right = _left_right(model, kind)
        ov_norm = ov_circuit(model).norm().detach()
        reader_norm = (ov_circuit(model) if kind == "V" else qk_circuit(model)).norm().detach()
        scores = torch.full(
            (cfg.n_layers, cfg.n_heads, cfg.n_layers, cfg.n_heads), math.nan, dtype=left.dtype
        )
        for layer_to in range(1, cfg.n_layers):
            # every pair (h1 in an earlier layer, h2 in layer_to) in one matrix product: the
            # d_head x d_head blocks of [(l_from h_from e), d_model] @ [d_model, (h_to f)]
            products = rearrange(left[:layer_to], "l h e d -> (l h e) d") @ rearrange(
                right[layer_to], "h d f -> d (h f)"
            )
            blocks = rearrange(
                products, "(l h1 e) (h2 f) -> l h1 h2 e f", l=layer_to, h1=cfg.n_heads, h2=cfg.n_heads
            )
            numerator = blocks.square().sum((-1, -2)).sqrt()
            denominator = ov_norm[:layer_to, :, None] * reader_norm[layer_to][None, None, :]
            scores[:layer_to, :, layer_to] = numerator / denominator
    return scores


@lru_cache(maxsize=32)
def composition_baseline(d_model: int, d_head: int, samples: int = BASELINE_SAMPLES) -> float:
    """The expected raw composition score of random heads of these shapes: the mean, over
    ``samples`` pairs of circuits ``X1 Y1`` and ``X2 Y2`` with Gaussian ``X [d_model, d_head]`` and
    ``Y [d_head, d_model]``, of ``‖X1 Y1 X2 Y2‖_F / (‖X1 Y1‖_F ‖X2 Y2‖_F)``, drawn in float64 from a
    fixed seed (so deterministic). The same for Q, K and V, since a random QK and a random OV
    circuit have the same distribution. The paper subtracts it; TransformerLens does not.
    """
    generator = torch.Generator().manual_seed(0)
    X1, Y1T, X2, Y2T = (
        torch.randn(samples, d_model, d_head, generator=generator, dtype=torch.float64) for _ in range(4)
    )
    R_X1, R_Y1, R_X2, R_Y2 = (_r_factor(M) for M in (X1, Y1T, X2, Y2T))
    fro = torch.linalg.matrix_norm
    numerator = fro(R_X1 @ Y1T.mT @ X2 @ R_Y2.mT)  # ‖X1 Y1 X2 Y2‖ = ‖R_X1 Y1 X2 R_Y2^T‖
    scores = numerator / (fro(R_X1 @ R_Y1.mT) * fro(R_X2 @ R_Y2.mT))
    return float(scores.mean())


def composition_scores(
    model: AttnOnlyTransformer, kind: str, subtract_baseline: bool = True
) -> Float[Tensor, "layer_from head_from layer_to head_to"]:
    """Q-, K- or V-composition scores for every pair of heads in different layers, indexed
    ``[layer_from, head_from, layer_to, head_to]``, NaN where ``layer_from >= layer_to``.

    With ``subtract_baseline`` (the paper's default), the expected score of random matrices of the
    same shapes (:func:`composition_baseline`) is subtracted, so about 0 means "no more than
    chance"; without it the raw score, as TransformerLens' ``all_composition_scores`` gives it.
    """
    scores = raw_composition_scores(model, kind)
    if subtract_baseline:
        scores = scores - composition_baseline(model.cfg.d_model, model.cfg.d_head)
    return scores


def k_composition_circuit(model: AttnOnlyTransformer, writer: str, reader: str) -> FactoredMatrix:
    """The token-level K-composition term ``W_E W_QK^h2 (W_E W_OV^h1)^T`` (row-vector form; the
    paper's ``W_E^T W_QK^h2 W_OV^h1 W_E``), ``[d_vocab, d_vocab]``, scaled by ``1/sqrt(d_head)``.

    Entry ``[a, b]`` is the attention score a destination token ``a`` of head ``reader`` gives a
    source whose key was written by head ``writer`` attending to token ``b``. When ``writer`` is a
    previous-token head, ``b`` is the token *before* the source, so a positive diagonal (eigenvalue
    positivity, :func:`k_composition_positivity`) means "attend to where my token came before":
    induction (section "How Induction Heads Work").
    """
    cfg = model.cfg
    (layer1, head1), (layer2, head2) = parse_head(writer, cfg), parse_head(reader, cfg)
    if layer1 >= layer2:
        raise QkovError(f"{writer} must be in an earlier layer than {reader} to K-compose with it")
    writer_attn, reader_attn = model.blocks[layer1].attn, model.blocks[layer2].attn
    queries = model.W_E @ reader_attn.W_Q[head2] * cfg.d_head**-0.5
    keys = model.W_E @ writer_attn.W_V[head1] @ writer_attn.W_O[head1] @ reader_attn.W_K[head2]
    return FactoredMatrix(queries, keys.mT)


def k_composition_positivity(
    model: AttnOnlyTransformer,
) -> Float[Tensor, "layer_from head_from layer_to head_to"]:
    """:func:`qkov.copying_score` of every :func:`k_composition_circuit`, NaN where
    ``layer_from >= layer_to``: near +1 for an induction head reading a previous-token head.

    The eigenvalues come from the ``d_head x d_head`` reordering ``(keys^T queries)``, with the
    token Gram matrix ``W_E^T W_E`` formed once, so no vocabulary-sized factor is built per pair."""
    cfg = model.cfg
    out = torch.full((cfg.n_layers, cfg.n_heads, cfg.n_layers, cfg.n_heads), math.nan, dtype=torch.float64)
    with torch.no_grad():
        W_E = model.W_E.double()
        gram = W_E.mT @ W_E
        W_Q, W_K, W_V, W_O = (stacked_weights(model, name).double() for name in ("W_Q", "W_K", "W_V", "W_O"))
        for layer_to in range(1, cfg.n_layers):
            queries = gram @ W_Q[layer_to]  # [head_to, d_model, d_head]
            for layer_from in range(layer_to):
                ov = W_V[layer_from] @ W_O[layer_from]  # [head_from, d_model, d_model]
                keys_T = W_K[layer_to].mT[None] @ ov.mT[:, None]  # [head_from, head_to, d_head, d_model]
                out[layer_from, :, layer_to] = copying_score(FactoredMatrix(keys_T, queries[None]))
    return out
