"""How alike the query heads of one grouped-query attention group are (section "OV and QK
Independence", for models whose heads share keys and values).

Under grouped-query attention the query heads of a group share ``W_K`` and ``W_V``: their OV circuits
``W_V W_O^h`` (paper, column vectors: ``W_O^h W_V``) share the same input map and differ only by
``W_O^h``; their QK circuits ``W_Q^h W_K^T`` share the key side. Two heads' circuits are compared
by the cosine of their full circuits over the whole vocabulary (Frobenius inner product over the
product of norms):

    ``cos(OV_a, OV_b) = <W_E W_V W_O^a W_U, W_E W_V W_O^b W_U> / (||.|| ||.||)``

computed exactly in the small space, ``tr((W_O^a)^T (W_V^T G_E W_V) W_O^b G_U)`` with the Gram
matrices ``G_E = W_E^T W_E`` and ``G_U = W_U W_U^T`` (``d_model x d_model``); the QK cosine alike,
with the model's QK circuit (rotary: averaged over offsets 1 to 64, :func:`qkov.qk_circuit`). A
cosine near 1 means the group's heads write (or look) alike: the group acts as one head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from qkov.interop.fold import circuit_model
from qkov.linalg import float64_gram
from qkov.model import Transformer
from qkov.names import head_name


@dataclass(frozen=True)
class GroupSimilarity:
    """One key/value group: its query heads and the cosines between their full OV and full QK
    circuits (``ov[i][j]``, ``qk[i][j]``, symmetric, 1 on the diagonal)."""

    layer: int
    group: int
    heads: list[str]
    ov: list[list[float]]
    qk: list[list[float]]


def _cosines(shared: Tensor, heads: Tensor, gram_shared: Tensor, gram_heads: Tensor) -> Tensor:
    """Cosines between the circuits of a group's heads, each the product of the factor ``F`` that
    they share (``shared``, ``[d, e]``: the group's ``W_V``, or its ``W_K``) and their own ``H_i``
    (``heads``, ``[n, e, d]``: each ``W_O^i``, or each ``W_Q^i`` transposed), read through the
    Gram matrices ``G_F`` and ``G_H`` of their ends: ``<P_i, P_j> = <F^T G_F F, H_i G_H H_j^T>``, ``e x
    e`` algebra per pair (for the OV circuits ``P_i = W_E W_V W_O^i W_U``, ``G_F = W_E^T W_E`` and
    ``G_H = W_U W_U^T``; for the QK circuits, ``P_i = W_E W_Q^i W_K^T W_E^T`` and both are
    ``W_E^T W_E``). The shared factor's part is formed once per group: at Llama-3.2-1B's shapes
    that is 1.8 of the 4.7 GFLOP that each circuit's cosines took with it formed for every pair."""
    inner = torch.einsum(
        "ef,ijef->ij",
        shared.mT @ gram_shared @ shared,
        torch.einsum("ied,jfd->ijef", heads @ gram_heads, heads),
    )
    norms = inner.diagonal().clamp_min(1e-300).sqrt()
    return inner / (norms[:, None] * norms[None, :])


def group_similarity(model: Transformer) -> list[GroupSimilarity]:
    """Every grouped-query attention group's cosines (see the module docstring); empty for a model
    whose heads each have their own keys and values."""
    cfg = model.cfg
    if cfg.n_kv_heads == cfg.n_heads:
        return []
    view = circuit_model(model)
    # in float64, a block of rows at a time: no float64 copy of W_E or W_U (2 GiB each at Llama 3's)
    W_E, W_U = view.outer_factors()
    gram_e, gram_u = float64_gram(W_E), float64_gram(W_U.mT)
    size, found = cfg.n_heads // cfg.n_kv_heads, []
    for layer, block in enumerate(view.blocks):
        attn = block.attn.requires_grad_(False)
        for group in range(cfg.n_kv_heads):
            heads = slice(group * size, (group + 1) * size)
            # the view repeats the group's W_K and W_V for each of its heads: its first head's serve all
            shared_v, shared_k = attn.W_V[heads.start].double(), attn.W_K[heads.start].double()
            ov = _cosines(shared_v, attn.W_O[heads].double(), gram_e, gram_u)
            qk = _cosines(shared_k, attn.W_Q[heads].double().mT, gram_e, gram_e)
            names = [head_name(layer, h) for h in range(heads.start, heads.stop)]
            found.append(GroupSimilarity(layer, group, names, ov.tolist(), qk.tolist()))
    return found
