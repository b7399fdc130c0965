"""Every head's full-vocabulary spectrum at once (section "Summarizing OV/QK Matrices"): the norm,
top singular values and effective rank of each full OV circuit
``W_E W_V W_O W_U`` (paper: ``W_U W_OV W_E``) and full QK circuit ``W_E W_Q W_K^T W_E^T / sqrt(d_head)``
(paper: ``W_E^T W_QK W_E``), token to token, positions left out.

All heads share ``W_E`` and ``W_U``: one square root of each one's Gram matrix (``d_model x
d_model``, computed once; :func:`qkov.linalg.outer_root`) reduces every head's ``d_vocab x d_vocab``
circuit to ``d_model``-sized algebra (:class:`qkov.linalg.SharedFactoredMatrix`), so the spectra of
GPT-2 small's 144 heads take seconds and no ``[heads, d_vocab, d_head]`` factor is ever built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from jaxtyping import Float
from torch import Tensor

from qkov.circuits.qk_ov import map_layers
from qkov.errors import QkovError
from qkov.linalg import SharedFactoredMatrix, numerical_rank
from qkov.model import AttnOnlyTransformer
from qkov.names import head_name


@dataclass(frozen=True)
class HeadSpectrum:
    """One head's full circuit, summarised:

    - ``norm``: the Frobenius norm;
    - ``singular_values``: the top ``k``, descending, fewer when the numerical rank is lower (the
      tolerance of ``torch.linalg.matrix_rank``);
    - ``effective_rank``: ``exp(-sum p_i log p_i)`` with ``p_i = s_i^2 / sum s^2`` over all singular
      values (1 for a rank-one circuit, the rank when they are equal; 0 for a zero circuit).

    The OV circuit's eigenvalue copying score is its :class:`qkov.circuits.copying.HeadCopying`'s.
    """

    name: str
    layer: int
    head: int
    norm: float
    singular_values: tuple[float, ...]
    effective_rank: float


def effective_rank(S: Float[Tensor, "... k"]) -> Float[Tensor, "..."]:
    """``exp`` of the entropy of ``S^2 / sum S^2`` (Roy and Vetterli's effective rank, on the energy
    ``s^2``); 0 when every singular value is 0."""
    energy = S.square()
    total = energy.sum(-1, keepdim=True)
    p = energy / torch.where(total > 0, total, 1)
    entropy = -torch.special.xlogy(p, p).sum(-1)
    return torch.where(total[..., 0] > 0, entropy.exp(), 0)


@torch.no_grad()
def head_spectra(
    model: AttnOnlyTransformer, circuit: Literal["OV", "QK"] = "OV", k: int = 10
) -> list[HeadSpectrum]:
    """One :class:`HeadSpectrum` per head, layer by layer, of every full OV or QK circuit."""
    if circuit not in ("OV", "QK"):
        raise QkovError(f"circuit must be 'OV' or 'QK', got {circuit!r}")
    if k < 1:
        raise QkovError(f"k must be at least 1, got {k}")

    def one_layer(layer: int, full: SharedFactoredMatrix) -> list[HeadSpectrum]:
        S = full.singular_values()[0]
        ranks = numerical_rank(S, full.m, full.n).tolist()
        norms = S.square().sum(-1).sqrt().tolist()  # the norm is exact from the same core
        effective = effective_rank(S.double()).tolist()
        return [
            HeadSpectrum(
                name=head_name(layer, head),
                layer=layer,
                head=head,
                norm=norms[head],
                singular_values=tuple(S[head, : min(k, ranks[head])].tolist()),
                effective_rank=effective[head],
            )
            for head in range(len(S))
        ]

    # one layer held at a time; under torchrun, each process's share of the layers
    return [row for rows in map_layers(model, circuit, one_layer) for row in rows]


@dataclass(frozen=True)
class Spectra:
    """Every head's full OV circuit ``W_E W_V W_O W_U`` and full QK circuit
    ``W_E W_Q W_K^T W_E^T / sqrt(d_head)`` (token to token) summarised over the whole vocabulary."""

    OV: list[HeadSpectrum]
    QK: list[HeadSpectrum]


def all_spectra(model: AttnOnlyTransformer, k: int = 10) -> Spectra:
    """:func:`head_spectra` of both circuits of every head, ``k`` singular values each."""
    return Spectra(head_spectra(model, "OV", k), head_spectra(model, "QK", k))
