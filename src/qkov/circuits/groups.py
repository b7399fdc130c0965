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


def _cosines(left: Tensor, right: Tensor, gram_left: Tensor, gram_right: Tensor) -> Tensor:
    """Cosines between the products ``P_i = X A_i B_i Y`` of each head ``i`` (``A = left``
    ``[n, d, e]``, ``B = right`` ``[n, e, d]``), with ``G_X = X^T X``, ``G_Y = Y Y^T``:
    ``<P_i, P_j> = tr(B_i^T A_i^T G_X A_j B_j G_Y)``, ``e x e`` algebra per pair."""
    n = len(left)
    middle = torch.einsum("ide,df,jfg->ijeg", left, gram_left, left)  # A_i^T G_X A_j
    outer = torch.einsum("jgh,hk,iek->ijge", right, gram_right, right)  # B_j G_Y B_i^T
    inner = torch.einsum("ijeg,ijge->ij", middle, outer)
    norms = inner.diagonal().clamp_min(1e-300).sqrt()
    assert inner.shape == (n, n)
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
            ov = _cosines(attn.W_V[heads].double(), attn.W_O[heads].double(), gram_e, gram_u)
            qk = _cosines(attn.W_Q[heads].double(), attn.W_K[heads].double().mT, gram_e, gram_e)
            names = [head_name(layer, h) for h in range(heads.start, heads.stop)]
            found.append(GroupSimilarity(layer, group, names, ov.tolist(), qk.tolist()))
    return found
