"""The circuit read off the weights (sections "Three Kinds of Composition" and "Two-Layer
Attention-Only Transformers"): heads as nodes with their roles, Q-, K- and V-composition as typed,
weighted edges between them, measured exactly on repeated random tokens.

*Roles*, each from the analysis that owns it: ``previous_token`` and ``induction``
(:mod:`qkov.circuits.repeated`'s thresholds), ``duplicate_token`` (mean attention to the previous
occurrence of the same token above :data:`DUPLICATE_TOKEN_HEAD`), ``copying`` (the OV eigenvalue
score above its random baseline, :mod:`qkov.circuits.copying`) and ``several_recent_tokens``
(:mod:`qkov.circuits.correction`).

*Edges*, writer ``w`` (a head of an earlier layer) into reader ``r``, with attention and LayerNorm
scales frozen at the model's run (:mod:`qkov.circuits.attribution`), every weight a signed share
that sums to 1 over all writers (the embeddings and biases included) of the reader's input:

- ``Q``: the share of the variation of ``r``'s pre-softmax scores (centred over each row, what
  softmax sees; :func:`~qkov.circuits.attribution.variance_share`) from the terms whose query part
  is one of ``w``'s parts (``L0H3``, ``L0H3.pos``, ``L0H3.bias``, ``L0H3.mlp``);
- ``K``: the same with the key part;
- ``V``: the share of ``r``'s write (``hook_result``) that ``w``'s parts carry through ``r``'s OV
  circuit at its frozen pattern, ``<write_w, write> / |write|^2`` over the batch and positions
  (paper, column vectors: ``A^r ⊗ W_OV^r`` applied to ``w``'s write).

An edge is kept when ``|weight| >= EDGE_THRESHOLD`` (0.1: a tenth of what the reader reads). Each
kept edge also carries ``parts``, its weight split by the writer's parts (what the explorer shows
when an edge is clicked), and ``name`` in the convention of automated circuit discovery (ACDC,
Conmy et al. 2023, TransformerLens hook names with ACDC's ``TorchIndex`` printed as ``[:, :, h]``):
``blocks.1.hook_k_input[:, :, 4]<-blocks.0.attn.hook_result[:, :, 3]`` for L0H3 into L1H4's keys.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from einops import einsum
from jaxtyping import Float, Int
from torch import Tensor

from qkov.circuits.attribution import Read, ScoreParts, centred_scores, layer_read, score_parts
from qkov.circuits.copying import Copying
from qkov.circuits.correction import Correction
from qkov.circuits.mechanisms import induction_mechanism_flop
from qkov.circuits.paths import BIAS, Frozen, freeze, post_linear, post_linear_adjoint
from qkov.circuits.repeated import RepeatedTokens
from qkov.config import Config
from qkov.model import AttnOnlyTransformer
from qkov.names import head_name, parse_head
from qkov.numbers import finite

EDGE_THRESHOLD = 0.1
# The induction threshold's value: on repeated random tokens both read attention to one offset.
DUPLICATE_TOKEN_HEAD = 0.3
KINDS = ("Q", "K", "V")
# the parts' queries or keys widened to float64 at a time, to take their overlaps (score_shares)
SHARE_BYTES = 2**28


@dataclass(frozen=True)
class CircuitNode:
    """A head and its roles (module docstring; empty when it plays none)."""

    head: str
    layer: int
    roles: list[str]


@dataclass(frozen=True)
class CircuitEdge:
    """``writer``'s composition into ``reader`` of ``kind`` Q, K or V, ``weight`` its share (module
    docstring), ``parts`` that share by the writer's part, ``name`` the ACDC-style edge name."""

    writer: str
    reader: str
    kind: str
    weight: float
    parts: dict[str, float]
    name: str


@dataclass(frozen=True)
class Circuit:
    """The circuit graph: every head (``nodes``), the edges of ``|weight| >= threshold``, measured
    on ``tokens``."""

    nodes: list[CircuitNode]
    edges: list[CircuitEdge]
    threshold: float
    tokens: str


def acdc_name(writer: str, reader: str, kind: str) -> str:
    """The edge's name as ACDC writes it (module docstring)."""
    (wl, wh), (rl, rh) = parse_head(writer), parse_head(reader)
    return f"blocks.{rl}.hook_{kind.lower()}_input[:, :, {rh}]<-blocks.{wl}.attn.hook_result[:, :, {wh}]"


@torch.no_grad()
def value_shares(
    model: AttnOnlyTransformer,
    tokens: Tensor,
    reader: str,
    frozen: Frozen,
    read: Read | None = None,
) -> dict[str, float | None]:
    """Each part's share ``<write_j, write> / |write|^2`` of ``reader``'s write (module docstring;
    ``read``: :func:`layer_read` of its layer, computed when not given).

    Part ``j``'s write is ``L(A v_j W_O^h)`` (``A``: the frozen pattern, ``v_j`` the part's values,
    ``L``: a post-attention norm's linear part, frozen, or nothing), so its overlap with the whole
    write is ``<v_j, A^T L^T(write) W_O^h^T>``, taken in ``d_head`` space: neither the parts' writes
    in ``d_model`` nor their ``z`` (one product with ``A`` per part) are formed. The whole write is
    made from the float64 sum of the parts' values, so the shares sum to one to float64 rounding."""
    layer, index = parse_head(reader, model.cfg)
    attn = model.blocks[layer].attn
    pattern = frozen.patterns[layer][:, index].double()
    names, x = layer_read(model, tokens, layer, frozen) if read is None else read
    v = x @ attn.W_V[index]  # [part, batch, pos, d_head]
    if BIAS in names and attn.b_V is not None:
        v[names.index(BIAS)] += attn.b_V[index]
    out = attn.W_O[index].double()
    whole = sum(chunk.sum(0) for chunk in _float64_chunks(v))  # [batch, pos, d_head]
    total = post_linear(model, frozen, layer, pattern @ whole @ out, False)  # [batch, pos, d_model]
    norm = float(total.square().sum())
    back = pattern.mT @ (post_linear_adjoint(model, frozen, layer, total) @ out.T)
    return _shares(names, v, back, norm)


def score_shares(parts: ScoreParts, side: str) -> dict[str, float | None]:
    """Each part's share of the variation of the reader's scores on the query or the key side: the
    terms of each part against the whole other side, ``T_j = q_j k^T`` (or ``q k_j^T``), each
    share ``Σ T~_j S~ / Σ S~^2`` as :func:`~qkov.circuits.attribution.variance_shares` defines it.

    ``S~`` (the whole scores, centred over each row's ``src <= dest``, 0 above the diagonal) sums to
    0 along each row, so ``Σ T~_j S~ = Σ T_j S~``, which is ``<q_j, S~ k>`` (or ``<k_j, S~^T q>``):
    taken in ``d_head`` space, no part's ``[batch, pos, pos]`` terms are formed. They were, in
    float64, and a 2-layer model of width 64 on 32 sequences of 1,024 tokens spent 72 s of its
    circuit graph on them, most of it the system clearing their fresh pages."""
    every_query, every_key = parts.queries.sum(0), parts.keys.sum(0)
    centred_total = centred_scores(every_query @ every_key.mT)
    norm = float(centred_total.square().sum())
    if side == "Q":
        own, through = parts.queries, centred_total @ every_key.double()  # [batch, dest, d_head]
    else:
        own, through = parts.keys, centred_total.mT @ every_query.double()  # [batch, src, d_head]
    return _shares(parts.names, own, through, norm)


def _float64_chunks(parts: Float[Tensor, "part batch pos d"]) -> Iterator[Tensor]:
    """``parts`` in float64, as many parts at a time as ``SHARE_BYTES`` holds."""
    step = max(1, SHARE_BYTES // (parts[0].numel() * 8))
    return (parts[at : at + step].double() for at in range(0, len(parts), step))


def _shares(
    names: list[str],
    parts: Float[Tensor, "part batch pos d"],
    other: Float[Tensor, "batch pos d"],
    norm: float,
) -> dict[str, float | None]:
    """Each part's float64 inner product with ``other`` over ``norm``, by name."""
    overlaps = [einsum(c, other, "part batch pos d, batch pos d -> part") for c in _float64_chunks(parts)]
    return {name: finite(float(o) / norm) for name, o in zip(names, torch.cat(overlaps), strict=True)}


def _parts_by_writer(names: list[str]) -> dict[str, list[str]]:
    """``names`` grouped by the head they start at (``L0H3`` and ``L0H3.<origin>``: what
    :func:`~qkov.circuits.correction.parts_of` finds for one writer, for every writer at once)."""
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(name.split(".")[0], []).append(name)
    return groups


def reader_edges(
    model: AttnOnlyTransformer,
    tokens: Tensor,
    reader: str,
    frozen: Frozen,
    threshold: float,
    read: Read | None = None,
) -> list[CircuitEdge]:
    """The kept edges into ``reader`` from every head of an earlier layer (``read``:
    :func:`layer_read` of its layer, computed when not given)."""
    parts = score_parts(model, tokens, reader, frozen, read)
    by_kind = {"Q": score_shares(parts, "Q"), "K": score_shares(parts, "K")}
    by_kind["V"] = value_shares(model, tokens, reader, frozen, read)
    layer, _ = parse_head(reader)
    edges = []
    for kind in KINDS:
        shares = by_kind[kind]
        groups = _parts_by_writer(list(shares))
        for writer in (head_name(w, h) for w in range(layer) for h in range(model.cfg.n_heads)):
            split = {name: shares[name] or 0.0 for name in groups.get(writer, [])}
            weight = sum(split.values())
            if abs(weight) >= threshold:
                edges.append(
                    CircuitEdge(writer, reader, kind, weight, split, acdc_name(writer, reader, kind))
                )
    return edges


def head_roles(
    repeated: RepeatedTokens, copying: Copying | None, correction: Correction | None
) -> dict[str, list[str]]:
    """Every head's roles (module docstring), by head name."""
    roles: dict[str, list[str]] = {h.name: [] for h in repeated.heads}
    copies = {h.name for h in copying.heads if h.copies} if copying is not None else set()
    recent = set(correction.recent_heads) if correction is not None else set()
    for h in repeated.heads:
        checks = (
            ("previous_token", h.name in repeated.previous_token_heads),
            ("induction", h.name in repeated.induction_heads),
            ("duplicate_token", (h.duplicate_token_score or 0.0) > DUPLICATE_TOKEN_HEAD),
            ("copying", h.name in copies),
            ("several_recent_tokens", h.name in recent),
        )
        roles[h.name] = [role for role, holds in checks if holds]
    return roles


def circuit_flop(cfg: Config, length: int) -> float:
    """FLOP per token of :func:`circuit_graph`: every reader's score parts (counted as the induction
    mechanism's), twice over for the per-part Q and K terms and once more for the V parts."""
    return 3 * induction_mechanism_flop(cfg, length, cfg.n_heads * max(cfg.n_layers - 1, 0))


@torch.no_grad()
def circuit_graph(
    model: AttnOnlyTransformer,
    tokens: Int[Tensor, "batch pos"],
    roles: dict[str, list[str]],
    described: str = "repeated random tokens",
    threshold: float = EDGE_THRESHOLD,
) -> Circuit:
    """The circuit graph of ``model`` on ``tokens`` with the heads' ``roles`` (:func:`head_roles`)."""
    tokens = model.check_tokens(tokens)
    frozen = freeze(model, tokens)
    cfg = model.cfg
    nodes = [
        CircuitNode(head_name(layer, h), layer, roles.get(head_name(layer, h), []))
        for layer in range(cfg.n_layers)
        for h in range(cfg.n_heads)
    ]
    edges = []
    for layer in range(1, cfg.n_layers):
        read = layer_read(model, tokens, layer, frozen)  # one per layer serves all its readers
        for h in range(cfg.n_heads):
            edges += reader_edges(model, tokens, head_name(layer, h), frozen, threshold, read)
    return Circuit(nodes, edges, threshold, described)
