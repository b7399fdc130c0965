"""QK and OV circuits, at residual, token and position level (sections "OV and QK Independence"
and "Summarizing OV/QK Matrices").

Each head is two independent circuits. In the paper's column-vector notation, the QK circuit
``W_QK = W_Q^T W_K`` says where a head looks and the OV circuit ``W_OV = W_O W_V`` what it writes.
In qkov's row-vector form (see :mod:`qkov`) they are ``W_Q W_K^T`` and ``W_V W_O``: the score of a
destination residual ``x`` for a source residual ``y`` is ``x W_Q W_K^T y^T / sqrt(d_head)``, and a
head attending to ``y`` writes ``y W_V W_O``.

The *full* circuits read tokens and write logits through the embeddings. They use only the
direct path into the head (the paper's ``W_E^T W_QK W_E`` and ``W_U W_OV W_E``), which is the
whole story for the first layer and the direct part for later ones. They are
``d_vocab x d_vocab`` and are kept factored (:class:`qkov.FactoredMatrix`), never built.

Biases (``b_Q``, ``b_K``, ``b_V``, ``b_O``), which the paper's models lack, are not part of any
circuit here.

GPT-2-style models: a model with unfolded LayerNorm is read through its folded form
(:func:`qkov.interop.fold.circuit_model`), so ``w`` is inside every circuit. What no weight holds
is each position's LayerNorm scale, a positive number per position: a token-level circuit is the
model's up to that scale (signs and eigenvalue positivity are exact, magnitudes approximate),
and it is the direct path only, so MLPs (including the first MLP, which reads the embedding) are
not part of it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Literal, NamedTuple, TypeVar

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from qkov.distributed import current as current_processes
from qkov.distributed import layer_share
from qkov.errors import QkovError
from qkov.interop.fold import ANALYSIS_OFFSETS, circuit_model
from qkov.linalg import FactoredMatrix, SharedFactoredMatrix
from qkov.model import AttnOnlyTransformer
from qkov.names import head_name

T = TypeVar("T")


def stacked_weights(model: AttnOnlyTransformer, name: str, layers: Sequence[int] | None = None) -> Tensor:
    """``W_Q``, ``W_K``, ``W_V`` or ``W_O`` of every layer (or of ``layers``),
    ``[n_layers, n_heads, ...]``."""
    if model.cfg.n_layers == 0:
        raise QkovError("a model with no layers has no attention heads")
    blocks = model.blocks if layers is None else [model.blocks[layer] for layer in layers]
    if len(blocks) == 1:  # one layer's: a view, not a copy (a pass over the layers reads one at a time)
        return getattr(blocks[0].attn, name)[None]
    return torch.stack([getattr(block.attn, name) for block in blocks])


def offsets_of(offset: int | range | None) -> range:
    """The offsets a rotary QK circuit averages over: one (``offset``), a range, or by default the
    analyses' :data:`~qkov.interop.fold.ANALYSIS_OFFSETS`."""
    if offset is None:
        return ANALYSIS_OFFSETS
    if isinstance(offset, range):
        if not len(offset):
            raise QkovError("offset: an empty range of offsets")
        return offset
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise QkovError(f"offset must be an integer (query position minus key position), got {offset!r}")
    return range(offset, offset + 1)


def qk_circuit(
    model: AttnOnlyTransformer, offset: int | range | None = None, layers: Sequence[int] | None = None
) -> FactoredMatrix:
    """Every head's QK circuit ``W_Q W_K^T`` (paper: ``W_QK = W_Q^T W_K``),
    ``[n_layers, n_heads, d_model, d_model]``, destination residual x source residual. With rotary
    positions it depends on the offset ``d`` (query position minus key position): ``W_Q R(d) W_K^T``
    (:mod:`qkov.rotary`), still of rank ``d_head``; ``offset`` is one offset or a range to average
    over (default: offsets 1 to 64). A model without rotary positions has the same circuit at
    every offset. ``layers``: those layers' heads only (``[len(layers), n_heads, ...]``)."""
    return _qk(circuit_model(model, offsets_of(offset)), layers)


def _qk(view: AttnOnlyTransformer, layers: Sequence[int] | None) -> FactoredMatrix:
    """:func:`qk_circuit` of a model that is its own circuit model already."""
    return FactoredMatrix(stacked_weights(view, "W_Q", layers), stacked_weights(view, "W_K", layers).mT)


def ov_circuit(model: AttnOnlyTransformer, layers: Sequence[int] | None = None) -> FactoredMatrix:
    """Every head's OV circuit ``W_V W_O`` (paper: ``W_OV = W_O W_V``),
    ``[n_layers, n_heads, d_model, d_model]``, source residual -> written residual (``layers``:
    those layers' heads only)."""
    return _ov(circuit_model(model), layers)


def _ov(view: AttnOnlyTransformer, layers: Sequence[int] | None) -> FactoredMatrix:
    """:func:`ov_circuit` of a model that is its own circuit model already."""
    return FactoredMatrix(stacked_weights(view, "W_V", layers), stacked_weights(view, "W_O", layers))


def shared_full_ov_circuit(
    model: AttnOnlyTransformer, layers: Sequence[int] | None = None
) -> SharedFactoredMatrix:
    """Every head's full OV circuit ``W_E (W_V W_O) W_U`` (paper: ``W_U W_OV W_E``) with ``W_E``
    and ``W_U`` kept shared: norms, singular values and eigenvalues of all heads come from
    ``d_model``-sized algebra, and no ``d_vocab``-long factor is built per head (``layers``: those
    layers' heads only)."""
    return _full(circuit_model(model), "OV", layers)


def _full(
    view: AttnOnlyTransformer, circuit: Literal["OV", "QK"], layers: Sequence[int] | None
) -> SharedFactoredMatrix:
    """The full OV or QK circuits of a model that is its own circuit model already."""
    W_E, W_U = view.outer_factors()
    if circuit == "OV":
        return SharedFactoredMatrix(W_E, _ov(view, layers), W_U)
    return SharedFactoredMatrix(W_E, _qk(view, layers) * view.cfg.d_head**-0.5, W_E.mT)


def full_circuits_by_layer(
    model: AttnOnlyTransformer,
    circuit: Literal["OV", "QK"],
    offset: int | range | None = None,
    layers: Iterable[int] | None = None,
) -> Iterator[SharedFactoredMatrix]:
    """Each layer's full OV or QK circuits in turn (``[1, n_heads, d_vocab, d_vocab]``, kept shared
    as :func:`shared_full_ov_circuit` keeps them), the roots of ``W_E`` and ``W_U`` computed once for
    all: a pass that holds one layer's heads at a time, so that a model read layer by layer
    (:mod:`qkov.interop.lazy`) is analysed in memory that does not grow with its depth. ``layers``:
    those to read (default: every one)."""
    view = circuit_model(model, offsets_of(offset))
    outer = None  # what is computed of W_E and W_U, not a layer's heads (256 MiB each at 70B's width)
    for layer in range(view.cfg.n_layers) if layers is None else layers:
        full = _full(view, circuit, [layer])
        outer = full.outer_only() if outer is None else outer
        yield full.share_outer(outer)


def map_layers(
    model: AttnOnlyTransformer,
    circuit: Literal["OV", "QK"],
    compute: Callable[[int, SharedFactoredMatrix], T],
) -> list[T]:
    """``compute(layer, full)`` for every layer's full circuits (:func:`full_circuits_by_layer`), in
    layer order. Under torchrun each process computes its share of the layers
    (:func:`qkov.distributed.layer_share`) and receives the others' (the results are those of one
    process: each layer's computation is the same wherever it runs)."""
    processes, n_layers = current_processes(), model.cfg.n_layers
    share = layer_share(n_layers, processes)
    own = {
        layer: compute(layer, full)
        for layer, full in zip(share, full_circuits_by_layer(model, circuit, layers=share), strict=True)
    }
    return processes.gather_layers(own, n_layers)


def full_ov_circuit(model: AttnOnlyTransformer) -> FactoredMatrix:
    """Source token -> logits through each head alone: ``W_E W_V W_O W_U`` (paper:
    ``W_U W_OV W_E``), ``[n_layers, n_heads, d_vocab, d_vocab]``. Entry ``[s, o]`` is how much
    attending to token ``s`` raises the logit of token ``o``. Its factors are ``d_vocab`` long
    for every head; for spectra use :func:`shared_full_ov_circuit`."""
    return shared_full_ov_circuit(model).factored()


class QKTerms(NamedTuple):
    """A head's attention scores split by what the query and key read (section "Summarizing
    OV/QK Matrices"): the pre-softmax score between destination ``d`` and source ``s`` is the sum
    of the four terms at ``[token_d, token_s]``, ``[token_d, pos_s]``, ``[pos_d, token_s]`` and
    ``[pos_d, pos_s]`` (direct path only). Every term is ``[n_layers, n_heads, rows, cols]``,
    with the ``1 / sqrt(d_head)`` scale included, so entries are attention scores."""

    token_token: FactoredMatrix
    token_pos: FactoredMatrix
    pos_token: FactoredMatrix
    pos_pos: FactoredMatrix


def shared_full_qk_circuit(
    model: AttnOnlyTransformer, offset: int | range | None = None, layers: Sequence[int] | None = None
) -> SharedFactoredMatrix:
    """Every head's token-token attention scores ``W_E (W_Q W_K^T / sqrt(d_head)) W_E^T`` (paper:
    ``W_E^T W_QK W_E``) with ``W_E`` kept shared (one root of its Gram matrix serves both sides);
    ``offset`` and ``layers`` as for :func:`qk_circuit`."""
    return _full(circuit_model(model, offsets_of(offset)), "QK", layers)


def full_qk_circuit(model: AttnOnlyTransformer, offset: int | range | None = None) -> FactoredMatrix:
    """Destination token x source token attention scores through each head:
    ``W_E W_Q W_K^T W_E^T / sqrt(d_head)`` (paper: ``W_E^T W_QK W_E``),
    ``[n_layers, n_heads, d_vocab, d_vocab]``. Scaled (by the model's own attention scale), so
    entries are pre-softmax scores (before a soft-cap). With rotary positions, the circuit at
    ``offset`` = query position minus key position (``W_E W_Q R(d) W_K^T W_E^T``: row = query token,
    column = key token), or averaged over a range of offsets (default 1 to 64); with query and key
    norms, exact up to each query's and each key's positive scale. For spectra use
    :func:`shared_full_qk_circuit`."""
    return shared_full_qk_circuit(model, offset).factored()


def qk_terms(model: AttnOnlyTransformer) -> QKTerms:
    """The token and position parts of every head's attention scores (see :class:`QKTerms`).

    Both the shortformer and the standard scheme feed ``W_E[token] + W_pos[pos]`` to the queries
    and keys of the first layer, so the score splits into four bilinear terms; how large each is
    tells how much a head's attention is about content and how much about position.
    """
    model = circuit_model(model)
    if model.W_pos is None:
        raise QkovError("the model has no positional embedding (positional_embedding='none')")
    scale = model.cfg.d_head**-0.5
    W_Q, W_K = stacked_weights(model, "W_Q") * scale, stacked_weights(model, "W_K")
    queries = {"token": model.W_E @ W_Q, "pos": model.W_pos @ W_Q}
    keys = {"token": (model.W_E @ W_K).mT, "pos": (model.W_pos @ W_K).mT}
    return QKTerms(
        **{
            f"{d}_{s}": FactoredMatrix(queries[d], keys[s])
            for d in ("token", "pos")
            for s in ("token", "pos")
        }
    )


def qk_term_rms(model: AttnOnlyTransformer) -> dict[str, Float[Tensor, "n_layers n_heads"]]:
    """The root-mean-square entry of each :class:`QKTerms` term: a scale-free summary of how much of
    each head's attention is about content and how much about position. Exact, from the norms of
    ``X (W_Q W_K^T / sqrt(d_head)) Y^T`` with ``X, Y`` each ``W_E`` or ``W_pos`` kept shared
    (:class:`~qkov.linalg.SharedFactoredMatrix`: one Gram root of each, nothing vocabulary-long per head)."""
    model = circuit_model(model)
    if model.W_pos is None:
        raise QkovError("the model has no positional embedding (positional_embedding='none')")
    sides = {"token": model.W_E, "pos": model.W_pos}
    first: dict[str, SharedFactoredMatrix] = {}  # each term's outer roots, computed once
    rms: dict[str, list[Tensor]] = {}
    for layer in range(model.cfg.n_layers):  # one layer's heads at a time
        qk = _qk(model, [layer]) * model.cfg.d_head**-0.5
        for d, s in itertools.product(sides, sides):
            full = SharedFactoredMatrix(sides[d], qk, sides[s].mT)
            full.share_outer(first.setdefault(f"{d}_{s}", full))
            rms.setdefault(f"{d}_{s}", []).append(full.norm() / math.sqrt(len(sides[d]) * len(sides[s])))
    return {term: torch.cat(values) for term, values in rms.items()}


def qk_position_content(model: AttnOnlyTransformer) -> dict[str, dict[str, float]] | None:
    """:func:`qk_term_rms` by term and head name (``{"token_pos": {"L0H0": ...}, ...}``), the form
    ``results.json`` holds; None for a model without a positional embedding."""
    if model.W_pos is None:
        return None
    return {
        term: {head_name(layer, head): float(v) for (layer, head), v in np.ndenumerate(values.cpu().numpy())}
        for term, values in qk_term_rms(model).items()
    }
