"""Frozen attention, path expansion, virtual weights and term importance (sections "Virtual
Weights and the Residual Stream", "Path Expansion of Logits" and "Term Importance Analysis").

Once the attention patterns ``A^h`` are fixed, every head is linear and the logits expand into a
sum over *paths* through the model. In the paper's tensor notation (column vectors),

    T = Id ⊗ W_U W_E  +  Σ_h A^h ⊗ W_U W_OV^h W_E  +  Σ_{h1<h2} (A^h2 A^h1) ⊗ W_U W_OV^h2 W_OV^h1 W_E + ...

and in qkov's row-vector form a path through heads ``h1, ..., hk`` (in increasing layers)
contributes ``A^hk ... A^h1 X W_V^h1 W_O^h1 ... W_V^hk W_O^hk W_U``, with ``X`` the embedded tokens
(plus positions in the standard scheme). A path is named by its heads: ``()`` is the direct path,
``("L0H3",)`` a single head, ``("L0H3", "L1H4")`` a virtual head. A model of ``n_layers`` layers
of ``n_heads`` heads has ``(n_heads + 1) ** n_layers`` paths.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from einops import einsum
from jaxtyping import Float, Int
from torch import Tensor

from qkov.errors import QkovError
from qkov.linalg import FactoredMatrix
from qkov.model import AttnOnlyTransformer
from qkov.names import head_name, hook_name, parse_head

Path = tuple[str, ...]
Patterns = list[Float[Tensor, "batch n_heads dest src"]]
BIAS = "bias"  # the term of path_expansion holding everything that starts at a bias


def frozen_patterns(model: AttnOnlyTransformer, tokens: Int[Tensor, "batch pos"]) -> Patterns:
    """Run once and record every layer's attention pattern, to rerun the model with them frozen
    (``model.run_with_cache(tokens, patterns=...)``): the logits are then linear in the one-hot
    tokens (section "OV and QK Independence")."""
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    return [cache[hook_name(layer, "pattern")] for layer in range(model.cfg.n_layers)]


def _through_head(
    model: AttnOnlyTransformer, layer: int, pattern: Tensor, stream: Float[Tensor, "batch pos d_model"]
) -> Float[Tensor, "batch pos n_heads d_model"]:
    """Every head of ``layer`` applied to one path's share of the stream, frozen and without
    biases: ``A^h stream W_V^h W_O^h``."""
    attn = model.blocks[layer].attn
    v = einsum(stream, attn.W_V, "batch pos d_model, n_heads d_model d_head -> batch n_heads pos d_head")
    z = pattern @ v
    return einsum(
        z, attn.W_O, "batch n_heads pos d_head, n_heads d_head d_model -> batch pos n_heads d_model"
    )


def _bias_part(model: AttnOnlyTransformer, patterns: Patterns, shape: torch.Size) -> Tensor:
    """The logits the frozen model gives on an all-zero embedding: everything that starts at a
    bias (``b_V``, ``b_O``, ``b_U``). The frozen model is affine; this is its constant part."""
    resid = torch.zeros(shape, dtype=model.W_E.dtype)
    for block, pattern in zip(model.blocks, patterns, strict=True):
        writes, _ = block.attn.head_writes(resid, None, pattern)
        resid = resid + writes.sum(dim=2) + block.attn.b_O
    return model.unembed(resid)


def path_expansion(
    model: AttnOnlyTransformer,
    tokens: Int[Tensor, "batch pos"],
    by: str = "path",
    patterns: Patterns | None = None,
) -> dict[Path | int | str, Float[Tensor, "batch pos d_vocab"]]:
    """The logits split exactly into one term per path (see the module docstring).

    ``by="path"`` keys each term by its path (``()``, ``("L0H3",)``, ``("L0H3", "L1H4")``, ...);
    ``by="order"`` sums the paths of each order (number of heads) and keys by the order
    ``0..n_layers``, which keeps memory at ``n_layers + 1`` logit tensors however many heads there
    are. A model with biases has one more term, ``"bias"``: what the frozen model gives on a zero
    embedding. The terms sum to ``model(tokens)`` (with ``patterns`` recorded from ``tokens``, the
    default).
    """
    if by not in ("path", "order"):
        raise QkovError(f"path_expansion: by must be 'path' or 'order', got {by!r}")
    tokens = model.check_tokens(tokens)
    with torch.no_grad():
        patterns = frozen_patterns(model, tokens) if patterns is None else patterns
        stream, _ = model.embed(tokens)
        streams: dict[Path, Tensor] = {(): stream}
        for layer, pattern in enumerate(patterns):
            for path, stream in list(streams.items()):
                writes = _through_head(model, layer, pattern, stream)
                for head in range(model.cfg.n_heads):
                    streams[(*path, head_name(layer, head))] = writes[:, :, head]
        if by == "order":
            orders: dict[int, Tensor] = {}
            for path, stream in streams.items():
                orders[len(path)] = orders.get(len(path), 0) + stream
            terms: dict = {order: stream @ model.W_U for order, stream in sorted(orders.items())}
        else:
            terms = {path: stream @ model.W_U for path, stream in streams.items()}
        if model.has_biases:
            terms[BIAS] = _bias_part(model, patterns, streams[()].shape)
    return terms


@dataclass(frozen=True)
class TermImportance:
    """Next-token loss (nats) with the paths up to each order kept and the rest cut.

    ``loss_by_order[n]`` keeps the paths through at most ``n`` heads (``loss_by_order[0]``: the
    direct path alone; ``loss_by_order[n_layers]``: every path, i.e. the model); ``marginal[n - 1]``
    is what order ``n`` adds (``loss_by_order[n - 1] - loss_by_order[n]``, positive when it
    helps). ``first_order_by_layer[l]`` and ``first_order_by_head[l][h]`` are the loss reduction
    when the first-order terms of layer ``l`` (or of one head) are added to the direct path.
    """

    loss_by_order: list[float]
    marginal: list[float]
    first_order_by_layer: list[float]
    first_order_by_head: list[list[float]]


def _next_token_loss(logits: Float[Tensor, "batch pos d_vocab"], tokens: Int[Tensor, "batch pos"]) -> float:
    return float(F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten()))


def _rerun(model: AttnOnlyTransformer, patterns: Patterns, start: Tensor, inputs: Sequence[Tensor]):
    """One frozen run whose heads read ``inputs`` (one stream per layer) instead of their own
    stream; returns the final stream and the stream each layer saw (for the next run)."""
    resid, seen = start, []
    for block, pattern, head_input in zip(model.blocks, patterns, inputs, strict=True):
        seen.append(resid)
        writes, _ = block.attn.head_writes(head_input, None, pattern)
        resid = resid + writes.sum(dim=2)
        if block.attn.b_O is not None:
            resid = resid + block.attn.b_O
    return resid, seen


def term_importance(model: AttnOnlyTransformer, tokens: Int[Tensor, "batch pos"]) -> TermImportance:
    """The paper's term importance analysis by path order (section "Term Importance Analysis").

    The attention patterns are recorded once and frozen. Run 0 is the direct path. Run ``n``
    feeds every head the stream that run ``n - 1`` computed at the head's layer, so a head's
    input holds paths through at most ``n - 1`` heads and the output paths through at most ``n``:
    ``n_layers + 1`` cheap runs instead of one per path. Biases (absent from the paper's models):
    ``b_U`` joins the direct path, and ``b_V`` and ``b_O`` count with the head or layer that adds
    them.
    The last run is the model itself, so ``loss_by_order[-1]`` is the model's loss.
    """
    tokens = model.check_tokens(tokens)
    if tokens.shape[1] < 2:
        raise QkovError("term importance needs sequences of at least 2 tokens (it measures next-token loss)")
    with torch.no_grad():
        patterns = frozen_patterns(model, tokens)
        start, _ = model.embed(tokens)
        inputs = [start] * model.cfg.n_layers
        losses = [_next_token_loss(model.unembed(start), tokens)]
        for _ in range(model.cfg.n_layers):
            resid, inputs = _rerun(model, patterns, start, inputs)
            losses.append(_next_token_loss(model.unembed(resid), tokens))
        by_layer, by_head = [], []
        for layer, block in enumerate(model.blocks):
            writes, _ = block.attn.head_writes(start, None, patterns[layer])
            by_layer.append(losses[0] - _next_token_loss(model.unembed(start + writes.sum(2)), tokens))
            by_head.append(
                [
                    losses[0] - _next_token_loss(model.unembed(start + writes[:, :, head]), tokens)
                    for head in range(model.cfg.n_heads)
                ]
            )
    return TermImportance(
        loss_by_order=losses,
        marginal=[losses[n - 1] - losses[n] for n in range(1, len(losses))],
        first_order_by_layer=by_layer,
        first_order_by_head=by_head,
    )


def virtual_weights(model: AttnOnlyTransformer, writer: str, reader: str) -> FactoredMatrix:
    """The matrix through which ``writer`` feeds ``reader`` across the residual stream (section
    "Virtual Weights"): the writer's output weights times the reader's input weights. The paper
    writes ``W_I^2 W_O^1`` (column vectors); here ``W_out @ W_in`` (row vectors).

    ``writer``: ``"embed"`` (``W_E``, ``[d_vocab, d_model]``), ``"pos"`` (``W_pos``) or a head
    ``"L0H3"`` (its ``W_O``, ``[d_head, d_model]``). ``reader``: a later head's input,
    ``"L1H4.Q"``, ``"L1H4.K"`` or ``"L1H4.V"`` (``W_Q`` ... ``[d_model, d_head]``), or ``"unembed"``
    (``W_U``). Factored, with inner dimension ``d_model``.
    """
    cfg = model.cfg
    if writer == "embed":
        out, writer_layer = model.W_E, -1
    elif writer == "pos":
        if model.W_pos is None:
            raise QkovError("the model has no positional embedding")
        out, writer_layer = model.W_pos, -1
    else:
        layer, head = parse_head(writer, cfg)
        out, writer_layer = model.blocks[layer].attn.W_O[head], layer
    if reader == "unembed":
        into, reader_layer, reads = model.W_U, cfg.n_layers, "U"
    else:
        name, _, reads = reader.partition(".")
        if reads not in ("Q", "K", "V"):
            raise QkovError(f"a head reader is 'L<layer>H<head>.Q', '.K' or '.V', got {reader!r}")
        layer, head = parse_head(name, cfg)
        into, reader_layer = getattr(model.blocks[layer].attn, f"W_{reads}")[head], layer
    if writer_layer >= reader_layer:
        raise QkovError(f"{writer} does not write before {reader} reads: no virtual weight between them")
    if writer == "pos" and cfg.positional_embedding == "shortformer" and reads not in ("Q", "K"):
        raise QkovError(
            "shortformer positions reach only the queries and keys, not values or the unembedding"
        )
    return FactoredMatrix(out, into)
