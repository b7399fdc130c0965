"""A rotary head's QK circuit split by frequency: which of its attention is about position and
which about content, read off the weights (the rotary counterpart of the paper's split of a head's
scores into token and position terms, section "Summarizing OV/QK Matrices").

With rotary positions (:mod:`qkov.rotary`) a head's score between a query token and a key token at
offset ``d`` is a sum over its rotation planes ``p`` (pairs of ``d_head`` dimensions) and the
dimensions that do not rotate:

    ``W_E W_Q R(d) W_K^T W_E^T = Σ_p W_E W_Q[:, p] R_p(d) W_K[:, p]^T W_E^T``
    ``+ W_E W_Q[:, f] W_K[:, f]^T W_E^T``

(row vectors; the paper, column vectors and no rotation, writes ``W_E^T W_Q^T W_K W_E``). A plane of
high frequency turns by a large angle per token: its term changes sign within a few tokens, so it
can only say "attend k tokens back" (position); a plane of low frequency barely turns over the
context, so its term is a skip-trigram-like preference between tokens wherever they are (content);
the non-rotating dimensions ``f`` of a partially rotary head are exactly position-free. Each band's
share here is its term's Frobenius norm at offset 0 (the planes' terms then sum to the circuit)
over the sum of all terms' norms: exact, from ``d_model``-sized Gram matrices, never a
``d_vocab x d_vocab`` product. Query/key-norm gains and the attention scale are in the weights read
(:func:`qkov.interop.fold.circuit_view`); each token's own scales are not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from qkov.interop.fold import ANALYSIS_OFFSETS, circuit_model
from qkov.linalg import FactoredMatrix, float64_gram
from qkov.model import Transformer
from qkov.names import head_name
from qkov.rotary import frequencies, plane_index, rotary_dim

POSITIONAL_WAVELENGTH = ANALYSIS_OFFSETS.stop - 1  # a plane that turns fully within 64 tokens: position


@dataclass(frozen=True)
class HeadBands:
    """One head's QK circuit by band: ``shares[i]`` is plane ``i``'s (wavelength ``wavelengths[i]``
    tokens) share of the circuit's norm; ``position_free`` the non-rotating dimensions' share;
    ``positional`` the share of planes shorter than :data:`POSITIONAL_WAVELENGTH` tokens."""

    head: str
    shares: list[float]
    position_free: float
    positional: float


@dataclass(frozen=True)
class RotaryBands:
    """Every head's bands, with the planes' wavelengths per layer (``2 pi / frequency``, tokens)."""

    wavelengths: list[list[float]]
    heads: list[HeadBands]
    positional_wavelength: int = POSITIONAL_WAVELENGTH


def _term_norms(M_Q: Tensor, M_K: Tensor, groups: list[Tensor]) -> Tensor:
    """``||W_E W_Q[:, g] W_K[:, g]^T W_E^T||_F`` for each group of dimensions ``g``, as
    ``sqrt(tr(M_Q[g, g] M_K[g, g]))`` with ``M = W^T G W`` (``d_head x d_head``, ``G = W_E^T W_E``):
    the groups' blocks of one product per head, not a ``d_model``-long product per group."""
    norms = []
    for dims in groups:
        value = torch.trace(M_Q[dims][:, dims] @ M_K[dims][:, dims]) if len(dims) else M_Q.new_zeros(())
        norms.append(value.clamp_min(0).sqrt())
    return torch.stack(norms)


def rotary_bands(model: Transformer) -> RotaryBands:
    """Every head's QK circuit split into its rotation planes and its position-free part (see the
    module docstring). Raises for a model without rotary positions."""
    cfg = model.cfg
    if cfg.positional_embedding != "rotary":
        raise ValueError("rotary_bands needs a model with rotary positions")
    view = circuit_model(model, range(0, 1))  # gains and scale in the weights, no rotation (offset 0)
    gram = float64_gram(view.outer_factors()[0])
    first, second = plane_index(cfg)
    groups = [torch.tensor([a, b]) for a, b in zip(first.tolist(), second.tolist(), strict=True)]
    groups.append(torch.arange(rotary_dim(cfg), cfg.d_head))
    wavelengths, heads, size = [], [], cfg.n_heads // cfg.n_kv_heads
    for layer, block in enumerate(view.blocks):
        wavelength = (2 * math.pi / frequencies(cfg, layer)).tolist()
        wavelengths.append(wavelength)
        short = torch.tensor([w < POSITIONAL_WAVELENGTH for w in wavelength])
        # the view repeats a group's W_K for each of its query heads: formed once per group (grouped-query
        # attention), 4 times less at Llama 3's shapes
        W_Q, W_K = block.attn.W_Q.detach().double(), block.attn.W_K.detach()[::size].double()
        M_Q = W_Q.mT @ (gram @ W_Q)  # [n_heads, d_head, d_head], a layer at once
        M_K = (W_K.mT @ (gram @ W_K)).repeat_interleave(size, 0)
        for head in range(cfg.n_heads):
            norms = _term_norms(M_Q[head], M_K[head], groups)
            shares = norms / norms.sum().clamp_min(1e-300)
            planes = shares[:-1]
            heads.append(
                HeadBands(
                    head_name(layer, head), planes.tolist(), float(shares[-1]), float(planes[short].sum())
                )
            )
    return RotaryBands(wavelengths, heads)


def position_free_qk_circuit(model: Transformer) -> FactoredMatrix:
    """Every head's QK circuit through the dimensions that do not rotate (a partially rotary head's,
    GPT-NeoX's and Phi's): ``W_Q[:, f] W_K[:, f]^T``, ``[n_layers, n_heads, d_model, d_model]``, the
    part of the scores that is the same at every offset, exactly (gains and the attention scale
    in, as :func:`qkov.qk_circuit`; the paper's ``W_Q^T W_K`` restricted to those dimensions). Zero
    for a fully rotary head; for a model without rotary positions, its whole QK circuit."""
    cfg = model.cfg
    view = circuit_model(model, range(0, 1))
    free = (
        slice(rotary_dim(cfg), cfg.d_head) if cfg.positional_embedding == "rotary" else slice(0, cfg.d_head)
    )
    W_Q = torch.stack([block.attn.W_Q.detach()[..., free] for block in view.blocks])
    W_K = torch.stack([block.attn.W_K.detach()[..., free] for block in view.blocks])
    return FactoredMatrix(W_Q, W_K.mT)
