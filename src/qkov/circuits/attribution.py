"""A head's pre-softmax attention scores split exactly into (query-side writer x key-side writer)
terms (sections "Residual Stream", "Three Kinds of Composition" and appendix "Handling Layer
Normalization").

The residual stream a head reads is a sum of writes. With the attention of the earlier layers and
every LayerNorm scale frozen at their values on the input (:func:`qkov.circuits.paths.freeze`),
``LN`` is affine and the head's queries and keys are sums over the stream's parts: for parts
``i`` (query side) and ``j`` (key side) the score between ``dest`` and ``src`` is

    score[dest, src] = Σ_ij  q_i[dest] . k_j[src] / sqrt(d_head),
    q_i = LN_lin(part_i) W_Q,   k_j = LN_lin(part_j) W_K

in qkov's row vectors (the paper, column vectors: ``part_i^T W_QK part_j`` with ``W_QK = W_Q^T W_K``),
``LN_lin(x) = (x - mean(x)) / scale * w`` with the scale frozen. The parts, by name:

- ``embed``: the token embeddings ``W_E[tokens]``;
- ``pos_embed``: the positions ``W_pos`` (in the stream for the standard scheme; for shortformer
  added to the queries' and keys' input only, not through LayerNorm);
- for every head of an earlier layer, its write split by where what it moves came from:
  ``L0H3`` carries its sources' token embeddings (by every path from ``embed``), ``L0H3.pos``
  their positions (standard scheme only: shortformer values never see a position),
  ``L0H3.bias`` what its frozen affine map adds to a zero stream (``b_V``, LayerNorm's ``b``,
  earlier ``b_O``), ``L0H3.mlp`` what it moves of earlier MLPs' writes (only after an MLP);
  the four sum to the head's write ``blocks.{l}.attn.hook_result``;
- ``L0MLP``: each earlier MLP's write (``b_out`` included);
- ``bias``: what is constant in the head's input: every earlier ``b_O`` (through ``LN_lin``),
  LayerNorm's ``b``, and the head's ``b_Q`` / ``b_K``.

A part that is zero by construction is left out (``pos_embed`` without positions, ``.pos`` under
shortformer, ``bias`` and ``.bias`` in a model with neither biases nor LayerNorm's ``b``, ``.mlp``
before any MLP).

Exact: the terms sum to the model's own scores (its attention and LayerNorm scales are recorded
from the same input, so the frozen run is the run). What is a reading, not an identity: a term says
what a pair of writers contributes *at these attention patterns and scales*; and an MLP's write is
nonlinear in both tokens and positions, so it is one part (``L0MLP``, ``L0H3.mlp``) that is not
split further into token and position.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from qkov.circuits.paths import (
    BIAS,
    Frozen,
    _has_constants,
    _head_writes,
    _through_head,
    bias_write,
    freeze,
    mlp_name,
)
from qkov.errors import QkovError
from qkov.model import AttnOnlyTransformer, LayerNorm
from qkov.names import head_name, norm_name, parse_head

EMBED, POS_EMBED = "embed", "pos_embed"
# A head's write by origin: the suffix of its part's name (token content has none).
TOKEN, POSITION, CONSTANT, MLP = "", ".pos", ".bias", ".mlp"


def stream_parts(
    model: AttnOnlyTransformer, tokens: Int[Tensor, "batch pos"], layer: int, frozen: Frozen
) -> dict[str, Float[Tensor, "batch pos d_model"]]:
    """The residual stream entering ``layer`` (its ``hook_resid_pre``) split into the parts of the
    module docstring, in the stream's order (shortformer's ``pos_embed`` is not in the stream)."""
    embed = model.W_E[tokens]
    origins: dict[str, Tensor] = {TOKEN: embed}  # the stream by origin, kept up to date layer by layer
    parts: dict[str, Tensor] = {EMBED: embed}
    if model.W_pos is not None and model.cfg.positional_embedding == "standard":
        origins[POSITION] = parts[POS_EMBED] = model.W_pos[: tokens.shape[1]].expand_as(embed)
    if _has_constants(model):
        origins[CONSTANT] = parts[BIAS] = torch.zeros_like(embed)
    for earlier in range(layer):
        for origin, stream in list(origins.items()):
            if origin == CONSTANT:  # only the constant part meets b_V and LayerNorm's b
                writes = _head_writes(model, frozen, earlier, stream)
            else:
                writes = _through_head(model, earlier, frozen, stream)
            for head in range(model.cfg.n_heads):
                parts[head_name(earlier, head) + origin] = writes[:, :, head]
            origins[origin] = stream + writes.sum(dim=2)
        b_O = bias_write(model, frozen, earlier, embed)
        if b_O is not None:
            origins[CONSTANT] = origins[CONSTANT] + b_O
            parts[BIAS] = parts[BIAS] + b_O
        if model.cfg.has_mlp:
            write = frozen.mlp_writes[earlier]
            parts[mlp_name(earlier)] = write
            origins[MLP] = origins.get(MLP, 0) + write
    return parts


@dataclass(frozen=True)
class ScoreParts:
    """One head's queries and keys split by part (see the module docstring): ``queries[i]`` (scaled
    by ``1 / sqrt(d_head)``) and ``keys[i]`` are what part ``names[i]`` gives, so that
    ``Σ_ij queries[i] @ keys[j]^T`` is the head's pre-softmax scores (before the causal mask)."""

    head: str
    names: list[str]
    queries: Float[Tensor, "part batch dest d_head"]
    keys: Float[Tensor, "part batch src d_head"]


def read_parts(
    ln: LayerNorm | None, scale: Tensor | None, streams: dict[str, Float[Tensor, "batch pos d_model"]]
) -> tuple[list[str], Float[Tensor, "part batch pos d_model"]]:
    """What a head reads of each part of :func:`stream_parts`: its LayerNorm's linear part with the
    scale frozen (``b`` joins the bias part), every part in one operation; the names in order."""
    names = list(streams)
    x = torch.stack([streams[name] for name in names])
    if ln is not None:
        x = ln.linear(x, scale)
        if BIAS in streams and ln.b is not None:
            x[names.index(BIAS)] += ln.b
    return names, x


# What the heads of a layer read, part by part (:func:`layer_read`): the parts' names in order and
# each part through the layer's norm, ``[part, batch, pos, d_model]``.
Read = tuple[list[str], Float[Tensor, "part batch pos d_model"]]


def layer_read(
    model: AttnOnlyTransformer, tokens: Int[Tensor, "batch pos"], layer: int, frozen: Frozen
) -> Read:
    """:func:`read_parts` of the stream entering ``layer`` (:func:`stream_parts`) through its ``ln1``
    with the scale frozen: the same for every head of the layer, so formed once for all of them (it
    is the largest tensor of a head's parts, and was formed twice per reader)."""
    scale = frozen.scales.get(norm_name(layer, "ln1"))
    return read_parts(model.blocks[layer].ln1, scale, stream_parts(model, tokens, layer, frozen))


def score_parts(
    model: AttnOnlyTransformer,
    tokens: Int[Tensor, "batch pos"],
    head: str,
    frozen: Frozen | None = None,
    read: Read | None = None,
) -> ScoreParts:
    """The queries and keys of ``head`` on ``tokens``, part by part (``frozen``: the model's run on
    ``tokens``, recorded when not given; ``read``: :func:`layer_read` of the head's layer with that
    ``frozen``, computed when not given: one per layer serves all its heads)."""
    tokens = model.check_tokens(tokens)
    layer, index = parse_head(head, model.cfg)
    with torch.no_grad():
        frozen = freeze(model, tokens) if frozen is None else frozen
        attn = model.blocks[layer].attn
        W_Q, W_K = attn.W_Q[index], attn.W_K[index]
        names, x = layer_read(model, tokens, layer, frozen) if read is None else read
        names = list(names)  # a shortformer's pos_embed is added below: not to the layer's list
        queries, keys = x @ W_Q, x @ W_K  # [part, batch, pos, d_head]
        if BIAS in names and attn.b_Q is not None:
            at = names.index(BIAS)
            queries[at] += attn.b_Q[index]
            keys[at] += attn.b_K[index]
        if attn.q_norm is not None:  # each part divided by the whole query's (key's) frozen scale
            queries, keys = _frozen_qk_norm(attn, index, x.sum(0), queries, keys)
        if attn.rotary is not None:  # a rotation is linear: each part's query and key turn by position
            queries, keys = attn.rotary(queries), attn.rotary(keys)
        if model.W_pos is not None and model.cfg.positional_embedding == "shortformer":
            positions = model.W_pos[: tokens.shape[1]].expand(tokens.shape[0], -1, -1)
            names.append(POS_EMBED)
            queries = torch.cat([queries, (positions @ W_Q)[None]])
            keys = torch.cat([keys, (positions @ W_K)[None]])
    return ScoreParts(head, names, queries / attn.scale, keys)


def _frozen_qk_norm(attn, index: int, read: Tensor, queries: Tensor, keys: Tensor) -> tuple[Tensor, Tensor]:
    """Query and key norms with their scales frozen at the head's whole query and key (``read``: all
    the layer reads, ``[batch, pos, d_model]``): ``q_i / s_q * g``, linear in each part ``q_i``. Per
    head, the scale is the head's own; over all heads (OLMo 2), that of every head's query (key) at
    once, and the gain the head's slice of it."""
    e, group = attn.d_head, attn.group_size
    every = []
    for weight, bias in ((attn.W_Q, attn.b_Q), (attn.kv_params("W_K"), attn.kv_params("b_K"))):
        raw = torch.einsum("bpd,nde->bpne", read, weight)
        every.append(raw if bias is None else raw + bias)
    scaled = []
    for part, raw, norm, head in (
        (queries, every[0], attn.q_norm, index),
        (keys, every[1], attn.k_norm, index // group),
    ):
        if attn.cfg.qk_norm == "head":
            scale, gain = norm.scale(raw[:, :, head]), norm.w
        else:
            scale, gain = norm.scale(raw.flatten(2)), norm.w[head * e : (head + 1) * e]
        scaled.append(part / scale * gain)
    return scaled[0], scaled[1]


def score_attribution(
    model: AttnOnlyTransformer, tokens: Int[Tensor, "batch pos"], head: str
) -> dict[tuple[str, str], Float[Tensor, "batch dest src"]]:
    """``head``'s pre-softmax scores on ``tokens`` split exactly into one term per (query-side part,
    key-side part) pair (names in the module docstring), each ``[batch, dest, src]``. The terms sum
    to the scores wherever ``src <= dest``; above the diagonal (masked) every term is 0.

    There are ``parts ** 2`` terms of ``batch x pos x pos`` each (a 2-layer model of 12 heads with
    standard positions: 26 parts, 676 terms):
    for large models or long inputs read :func:`score_parts` and contract what you need.
    """
    parts = score_parts(model, tokens, head)
    n = parts.queries.shape[2]
    causal = torch.ones(n, n, dtype=torch.bool, device=parts.queries.device).tril()
    terms = {}
    for i, query in enumerate(parts.names):
        products = parts.queries[i] @ parts.keys.mT  # [part, batch, dest, src]: every key part at once
        for j, key in enumerate(parts.names):
            terms[(query, key)] = products[j].masked_fill(~causal, 0.0)
    return terms


@dataclass(frozen=True)
class TargetShares:
    """How much each (query part, key part) term raises ``head``'s score on a target source above
    the other sources: ``contributions[i, j]`` is the mean over the batch and the destinations of
    term ``(names[i], names[j])``'s score at the target minus its mean score at the other
    ``src <= dest``; they sum to ``margin``, the head's own mean margin, and ``shares =
    contributions / margin`` (signed, summing to 1; undefined, NaN, when the margin is 0)."""

    head: str
    names: list[str]
    contributions: Float[Tensor, "query_part key_part"]
    margin: float
    shares: Float[Tensor, "query_part key_part"]


def induction_target_shares(parts: ScoreParts, period: int) -> TargetShares:
    """:class:`TargetShares` on tokens repeating every ``period`` positions, for the induction
    target ``src = dest - period + 1`` at every ``dest >= period`` (section "How Induction Heads
    Work": the token after the current token's previous occurrence). Computed in float64 without
    building a term: each term's margin is ``q_i[dest] . (k_j[target] - mean of k_j[other src])``."""
    n = parts.keys.shape[2]
    if not 2 <= period < n:
        raise QkovError(f"induction shares need a period in [2, {n - 1}] for {n} positions, got {period}")
    queries, keys = parts.queries.double(), parts.keys.double()
    dests = torch.arange(period, n, device=keys.device)
    targets = dests - period + 1
    up_to = keys.cumsum(dim=2)[:, :, dests]  # Σ_{src <= dest} k_j[src]
    at_target = keys[:, :, targets]
    contrast = at_target - (up_to - at_target) / dests[:, None].to(keys.dtype)  # the others: dest of them
    contributions = torch.einsum("ibde,jbde->ij", queries[:, :, dests], contrast) / (
        keys.shape[1] * len(dests)
    )
    margin = float(contributions.sum())
    shares = contributions / margin if margin != 0 else torch.full_like(contributions, float("nan"))
    return TargetShares(parts.head, parts.names, contributions, margin, shares)


def centred_scores(scores: Float[Tensor, "batch dest src"]) -> Float[Tensor, "batch dest src"]:
    """``scores`` in float64, centred over each row's ``src <= dest`` (softmax ignores a constant
    added to a row) and 0 above the diagonal: what attention sees of them."""
    n = scores.shape[-1]
    causal = torch.ones(n, n, dtype=torch.bool, device=scores.device).tril()
    counts = torch.arange(1, n + 1, device=scores.device, dtype=torch.float64)[:, None]
    scores = scores.double().masked_fill(~causal, 0.0)
    return (scores - scores.sum(-1, keepdim=True) / counts).masked_fill(~causal, 0.0)


def variance_share(term: Float[Tensor, "batch dest src"], total: Float[Tensor, "batch dest src"]) -> float:
    """One term's share ``Σ T~ S~ / Σ S~^2`` of the variation of the scores ``total`` (both centred
    by :func:`centred_scores`; see :func:`variance_shares`)."""
    centred_total = centred_scores(total)
    return float((centred_scores(term) * centred_total).sum()) / float(centred_total.square().sum())


def variance_shares(
    terms: dict[tuple[str, str], Float[Tensor, "batch dest src"]],
) -> dict[tuple[str, str], float]:
    """Each term's share of the variation of the scores that attention sees (a summary for a head on
    any input, section "Summarizing OV/QK Matrices"): softmax ignores a constant added to a row, so
    every term and the total ``S`` are centred over each row's ``src <= dest``, and a term ``T``'s
    share is ``Σ T~ S~ / Σ S~^2`` (over the batch and every ``src <= dest``). Exact and signed: the
    shares sum to 1; a term that only shifts whole rows has share 0."""
    total = centred_scores(sum(terms.values()))
    norm = float(total.square().sum())
    return {pair: float((centred_scores(term) * total).sum()) / norm for pair, term in terms.items()}
