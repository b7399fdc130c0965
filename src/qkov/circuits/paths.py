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

GPT-2-style models (appendix "Handling Layer Normalization" and the MLP discussion):

- *LayerNorm*: each position's LayerNorm scale is frozen at its value in the model's own run, as the
  attention patterns are; ``LN(x) = (x - mean(x)) / scale * w + b`` is then affine in ``x``: its
  linear part travels along the path, ``b`` joins the bias term.
- *MLPs*: each MLP's write is frozen too (its direct effect, like the patterns): the write of the
  MLP of layer ``l`` starts further paths, named ``("L0MLP",)``, ``("L0MLP", "L1H4")``..., through
  the heads of later layers.

With both frozen the terms still sum exactly to the model's logits. What is approximate is the
reading, not the sum: a term says what a path contributes *at these scales and these MLP writes*,
not what the path would do if the rest of the model changed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from einops import einsum
from jaxtyping import Float, Int
from torch import Tensor

from qkov.circuits.budget import forward_flop, unembed_flop
from qkov.config import Config
from qkov.data.user_tokens import IGNORE
from qkov.errors import QkovError
from qkov.hooks import patterns_only
from qkov.interop.fold import circuit_model
from qkov.linalg import FactoredMatrix
from qkov.loss import logit_buffer, logsumexp_, row_blocks, row_losses
from qkov.model import AttnOnlyTransformer, LayerNorm
from qkov.names import head_name, hook_name, norm_name, parse_head, scale_hook

Path = tuple[str, ...]
Patterns = list[Float[Tensor, "batch n_heads dest src"]]
BIAS = "bias"  # the term of path_expansion holding everything that starts at a bias
MLP_PATHS = "mlp"  # path_expansion(by="order"): the sum of every path that starts at an MLP's write


class PathTerms(dict):
    """What :func:`path_expansion` returns: a plain ``dict`` of logit terms ``[batch, pos, d_vocab]``
    keyed by path (``()``, ``("L0H3",)``, ...), by order (``0, 1, ...``) or ``"bias"`` / ``"mlp"``,
    whose values sum to the logits. A ``dict`` subclass only so that notebooks can show it
    (:mod:`qkov.view`)."""

    @staticmethod
    def label(key: Path | int | str) -> str:
        """How a term is named where a person reads it: ``direct``, ``L0H3``, ``L0H3 → L1H4``,
        ``order 1``, ``bias``."""
        if key == ():
            return "direct"
        if isinstance(key, tuple):
            return " → ".join(key)
        return f"order {key}" if isinstance(key, int) else str(key)


def mlp_name(layer: int) -> str:
    """The MLP of a layer as a path's first component: ``L0MLP``."""
    return f"L{layer}MLP"


def frozen_patterns(model: AttnOnlyTransformer, tokens: Int[Tensor, "batch pos"]) -> Patterns:
    """Run once and record every layer's attention pattern, to rerun the model with them frozen
    (``model.run_with_cache(tokens, patterns=...)``): the logits of an attention-only model without
    LayerNorm are then linear in the one-hot tokens (section "OV and QK Independence")."""
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=patterns_only, return_type=None)
    return [cache[hook_name(layer, "pattern")] for layer in range(model.cfg.n_layers)]


@dataclass(frozen=True)
class Frozen:
    """What path expansion holds fixed, from one run of the model: every attention pattern, every
    LayerNorm scale (``cache`` names without ``.hook_scale``, e.g. ``"blocks.0.ln1"``, ``"ln_final"``;
    empty without LayerNorm) and every MLP's write (empty without MLPs). Given these, the model is
    affine in its embedding."""

    patterns: Patterns
    scales: dict[str, Tensor]
    mlp_writes: list[Tensor]


def _frozen_name(name: str) -> bool:
    """Whether :func:`freeze` reads the activation of hook ``name``."""
    return name.endswith(("hook_pattern", "hook_scale", "hook_mlp_out"))


def freeze(
    model: AttnOnlyTransformer, tokens: Int[Tensor, "batch pos"], patterns: Patterns | None = None
) -> Frozen:
    """Record :class:`Frozen` from a run on ``tokens`` (with ``patterns`` frozen when given)."""
    with torch.no_grad():
        _, cache = model.run_with_cache(
            tokens, patterns=patterns, names_filter=_frozen_name, return_type=None
        )
    n = model.cfg.n_layers
    norms = [norm_name(layer, ln) for layer in range(n) for ln in ("ln1", "ln2", "ln1_post", "ln2_post")] + [
        norm_name(None, "ln_final")
    ]
    return Frozen(
        patterns=[cache[hook_name(layer, "pattern")] for layer in range(n)],
        scales={name: cache[scale_hook(name)] for name in norms if scale_hook(name) in cache},
        mlp_writes=[cache[hook_name(layer, "mlp_out")] for layer in range(n) if model.cfg.has_mlp],
    )


def _linear_read(ln: LayerNorm | None, scale: Tensor | None, stream: Tensor) -> Tensor:
    """The linear part of what a reader sees of one path's share of the stream: ``ln`` with its
    scale frozen and without ``b`` (or the stream itself without LayerNorm)."""
    return stream if ln is None else ln.linear(stream, scale)


def _affine_read(ln: LayerNorm | None, scale: Tensor | None, stream: Tensor) -> Tensor:
    """``ln(stream)`` with its scale frozen (``b`` included)."""
    return stream if ln is None else ln(stream, scale)


def _through_head(
    model: AttnOnlyTransformer, layer: int, frozen: Frozen, stream: Float[Tensor, "batch pos d_model"]
) -> Float[Tensor, "batch pos n_heads d_model"]:
    """Every head of ``layer`` applied to one path's share of the stream, frozen and without
    biases: ``A^h LN_lin(stream) W_V^h W_O^h``."""
    block = model.blocks[layer]
    x = _linear_read(block.ln1, frozen.scales.get(norm_name(layer, "ln1")), stream)
    v = einsum(x, block.attn.W_V, "batch pos d_model, n_heads d_model d_head -> batch n_heads pos d_head")
    z = frozen.patterns[layer] @ v
    writes = einsum(
        z, block.attn.W_O, "batch n_heads pos d_head, n_heads d_head d_model -> batch pos n_heads d_model"
    )
    return post_linear(model, frozen, layer, writes, per_head=True)


def post_linear(
    model: AttnOnlyTransformer, frozen: Frozen, layer: int, writes: Tensor, per_head: bool
) -> Tensor:
    """What a norm after the layer's attention (Gemma 2 and 3, OLMo 2) makes of a share of its write,
    with its scale frozen: its linear part (``writes`` itself without one). ``per_head``: ``writes``
    is ``[batch, pos, n_heads, d_model]``."""
    post = model.blocks[layer].ln1_post
    if post is None:
        return writes
    scale = frozen.scales[norm_name(layer, "ln1_post")]
    return post.linear(writes, scale[..., None, :] if per_head else scale)


def post_linear_adjoint(model: AttnOnlyTransformer, frozen: Frozen, layer: int, y: Tensor) -> Tensor:
    """The adjoint of :func:`post_linear` on the layer's whole write (``<post_linear(x), y> =
    <x, post_linear_adjoint(y)>`` at each position): ``y`` itself without a post-attention norm."""
    post = model.blocks[layer].ln1_post
    return y if post is None else post.linear_adjoint(y, frozen.scales[norm_name(layer, "ln1_post")])


def bias_write(model: AttnOnlyTransformer, frozen: Frozen, layer: int, like: Tensor) -> Tensor | None:
    """The layer's constant write: ``b_O``, or after a post-attention norm (frozen) what it makes of
    ``b_O`` with its own bias; None when there is none."""
    block = model.blocks[layer]
    if block.ln1_post is None:
        return block.attn.b_O
    b_O = torch.zeros_like(like) if block.attn.b_O is None else block.attn.b_O.expand_as(like)
    constant = block.ln1_post(b_O, frozen.scales[norm_name(layer, "ln1_post")])
    return constant if block.attn.b_O is not None or block.ln1_post.b is not None else None


def _unembed_linear(model: AttnOnlyTransformer, frozen: Frozen, stream: Tensor) -> Tensor:
    return _linear_read(model.ln_final, frozen.scales.get(norm_name(None, "ln_final")), stream) @ model.W_U


def _unembed_affine(model: AttnOnlyTransformer, frozen: Frozen, resid: Tensor) -> Tensor:
    logits = _affine_read(model.ln_final, frozen.scales.get(norm_name(None, "ln_final")), resid) @ model.W_U
    return logits if model.b_U is None else logits + model.b_U


def _has_constants(model: AttnOnlyTransformer) -> bool:
    """Whether the frozen model has a constant part (a bias, or LayerNorm's ``b``)."""
    return model.has_biases or model.cfg.normalization == "LN"


def _bias_part(model: AttnOnlyTransformer, frozen: Frozen, shape: torch.Size) -> Tensor:
    """The logits the frozen model gives on an all-zero embedding with every MLP write left out
    (those are terms of their own): everything that starts at a bias (``b_V``, ``b_O``, ``b_U``,
    LayerNorm's ``b``). The frozen model is affine; this is its constant part."""
    resid = torch.zeros(shape, dtype=model.W_E.dtype, device=model.device)
    for layer in range(model.cfg.n_layers):
        resid = resid + _layer_write(model, frozen, layer, resid)
        constant = bias_write(model, frozen, layer, resid)
        if constant is not None:
            resid = resid + constant
    return _unembed_affine(model, frozen, resid)


def path_expansion(
    model: AttnOnlyTransformer,
    tokens: Int[Tensor, "batch pos"],
    by: str = "path",
    patterns: Patterns | None = None,
) -> PathTerms:
    """The logits split exactly into one term per path (see the module docstring), as a
    :class:`PathTerms` (a ``dict`` of ``Float[Tensor, "batch pos d_vocab"]``).

    ``by="path"`` keys each term by its path (``()``, ``("L0H3",)``, ``("L0H3", "L1H4")``, ...;
    with MLPs also ``("L0MLP",)``, ``("L0MLP", "L1H4")``, ...); ``by="order"`` sums the paths from
    the embedding of each order (number of heads) and keys by the order ``0..n_layers``, with every
    path that starts at an MLP summed under ``"mlp"``, which keeps memory at ``n_layers + 2`` logit
    tensors however many heads there are. A model with biases (or LayerNorm's ``b``) has one more
    term, ``"bias"``: what the frozen model gives on a zero embedding without the MLP writes. The
    terms sum to the logits of the frozen run (``model(tokens)`` itself when ``patterns`` is None,
    the default: patterns, LayerNorm scales and MLP writes recorded from ``tokens``).
    """
    if by not in ("path", "order"):
        raise QkovError(f"path_expansion: by must be 'path' or 'order', got {by!r}")
    tokens = model.check_tokens(tokens)
    with torch.no_grad():
        frozen = freeze(model, tokens, patterns)
        stream, _ = model.embed(tokens)
        streams: dict[Path, Tensor] = {(): stream}
        for layer in range(model.cfg.n_layers):
            for path, stream in list(streams.items()):
                writes = _through_head(model, layer, frozen, stream)
                for head in range(model.cfg.n_heads):
                    streams[(*path, head_name(layer, head))] = writes[:, :, head]
            if model.cfg.has_mlp:
                streams[(mlp_name(layer),)] = frozen.mlp_writes[layer]
        if by == "order":
            orders: dict[int | str, Tensor] = {}
            for path, stream in streams.items():
                key = MLP_PATHS if path and path[0].endswith("MLP") else len(path)
                orders[key] = orders.get(key, 0) + stream
            terms = PathTerms({key: _unembed_linear(model, frozen, stream) for key, stream in orders.items()})
        else:
            terms = PathTerms(
                {path: _unembed_linear(model, frozen, stream) for path, stream in streams.items()}
            )
        if _has_constants(model):
            terms[BIAS] = _bias_part(model, frozen, streams[()].shape)
    return terms


@dataclass(frozen=True)
class TermImportance:
    """Loss (nats) with the paths up to each order kept and the rest cut: against the next token,
    or against the given targets (a task's own, e.g. a classifier's label at its last position).

    ``loss_by_order[n]`` keeps the paths through at most ``n`` heads (``loss_by_order[0]``: the
    direct path alone; ``loss_by_order[n_layers]``: every path, i.e. the model); ``marginal[n - 1]``
    is what order ``n`` adds (``loss_by_order[n - 1] - loss_by_order[n]``, positive when it
    helps). ``first_order_by_layer[l]`` and ``first_order_by_head[l][h]`` are the loss reduction
    when the first-order terms of layer ``l`` (or of one head) are added to the direct path.
    ``tokens`` says what they were measured on. ``loss_by_order_by_sequence[n][i]`` is
    ``loss_by_order[n]`` on sequence ``i`` alone, which scores ``scored_by_sequence[i]`` tokens (the
    sequences with any): the units over which a figure's standard error is taken
    (:func:`qkov.numbers.weighted_ratio_se`), ``loss_by_order[n]`` being their mean weighted by
    the tokens scored.
    """

    loss_by_order: list[float]
    marginal: list[float]
    first_order_by_layer: list[float]
    first_order_by_head: list[list[float]]
    tokens: str
    loss_by_order_by_sequence: list[list[float]] = field(default_factory=list)
    scored_by_sequence: list[int] = field(default_factory=list)


# What term importance scores: the ``targets`` given (or None), each scored row's target and the
# sequence it belongs to.
_Scored = tuple[Tensor | None, Int[Tensor, " rows"], Int[Tensor, " rows"]]


def _rows(x: Tensor, targets: Tensor | None) -> Tensor:
    """``x`` ``[batch, pos, ...]`` at the positions that are scored, as rows: every position but the
    last against the next token (``targets`` None), else every position (``targets`` says which
    count)."""
    return (x[:, :-1] if targets is None else x).flatten(0, 1)


def _scored(tokens: Int[Tensor, "batch pos"], targets: Tensor | None) -> _Scored:
    """What each of :func:`_rows`' rows is scored against (``IGNORE``: nothing), and its sequence."""
    wanted = tokens[:, 1:].flatten() if targets is None else targets.flatten()
    sequence = torch.arange(tokens.shape[0], device=tokens.device).repeat_interleave(
        len(wanted) // len(tokens)
    )
    return targets, wanted, sequence


def _sequence_losses(
    model: AttnOnlyTransformer,
    frozen: Frozen,
    resid: Float[Tensor, "batch pos d_model"],
    scored: _Scored,
    buffer: Float[Tensor, "chunk d_out"],
) -> Float[Tensor, " batch"]:
    """Each sequence's summed cross-entropy (float64) of ``resid``'s logits (the final LayerNorm's
    scale frozen) against the scored rows' targets (:func:`_rows`; ``IGNORE`` rows left out), the
    logits formed in ``buffer`` (:func:`qkov.loss.row_losses`)."""
    targets, wanted, sequence = scored
    final = _affine_read(model.ln_final, frozen.scales.get(norm_name(None, "ln_final")), resid)
    kept = wanted != IGNORE
    losses = row_losses(_rows(final, targets)[kept], model.W_U, model.b_U, wanted[kept], buffer)
    total = torch.zeros(len(resid), dtype=torch.float64, device=final.device)
    return total.index_add_(0, sequence[kept], losses.double())


def _head_writes(model: AttnOnlyTransformer, frozen: Frozen, layer: int, stream: Tensor) -> Tensor:
    """Every head of ``layer`` reading ``stream`` with its pattern and LayerNorm scale frozen
    (biases included but ``b_O``), ``[batch, pos, n_heads, d_model]``."""
    block = model.blocks[layer]
    x = _affine_read(block.ln1, frozen.scales.get(norm_name(layer, "ln1")), stream)
    return post_linear(model, frozen, layer, block.attn.head_writes(x, None, frozen.patterns[layer])[0], True)


def _layer_write(model: AttnOnlyTransformer, frozen: Frozen, layer: int, stream: Tensor) -> Tensor:
    """:func:`_head_writes` summed over the heads, ``[batch, pos, d_model]``, in one product."""
    block = model.blocks[layer]
    x = _affine_read(block.ln1, frozen.scales.get(norm_name(layer, "ln1")), stream)
    return post_linear(model, frozen, layer, block.attn.layer_write(x, frozen.patterns[layer]), False)


# The first-order losses go through the logits a block of at most ROWS rows (the rows split evenly,
# :func:`qkov.loss.row_blocks`) and COLUMNS columns at a time, which stays in cache: at GPT-2
# small's shapes the rank-64 products ran 3x faster so than over whole rows. Many rows by few
# columns beat few by many: a product 64 deep runs faster on more rows (184-190 against 154-158
# GFLOP/s on 2 threads), and the loop's four 1,032 x 512 blocks (2 MiB each) fit in half the cache
# that 256 x 4096 blocks take. At GPT-2 small's and Llama-3.2-1B's shapes they took 0.85-0.89x the
# time of 256 x 4096 blocks (benchmarks/paths.py --first-order), and 0.52-0.57x minutes before on a
# busier machine.
ROWS, COLUMNS = 2048, 512
# A head whose logit terms are at most REACH nats in size on a block of rows (Cauchy-Schwarz, row by
# row) has its logsumexp summed in exp space: exp(term) times the direct path's exp(logit - row
# max), formed once, so one exp and one multiply-add an entry instead of logsumexp's passes. Within
# REACH no exp leaves float32's normal range; the direct path's entries below exp(-FLOOR) are set to
# zero (so no product is subnormal, which is slow), and they add at most d_out e^(REACH - FLOOR) to a
# sum of at least e^-REACH: 2e-13 of it at 50257 outputs. Larger terms take the logsumexp.
REACH, FLOOR = 10.0, 60.0
# Those exponentials are taken in base 2, exp(t) = 2^(t log2 e), with log2 e folded into the heads'
# z (a few thousand numbers a block) rather than a pass over the terms: torch's exp2 on a CPU took
# 0.6x the time of its exp (0.38 against 0.61 ms a 1,032 x 512 block, one thread, AVX2), and the
# exponentials took 6.7 s of term importance's 47 at GPT-2 small's shapes (cProfile); the loop took
# 0.79-0.81x the time (benchmarks/paths.py --first-order). The terms then differ from the natural
# ones by float rounding (an ulp of the scaled z).
LOG2E, LN2 = math.log2(math.e), math.log(2.0)


@dataclass(frozen=True)
class _Direct:
    """The direct path's logits at the scored rows (:func:`_rows`), with what every first-order loss
    reuses: each row's largest logit ``top`` and ``weights = exp(logits - top)`` (zero below
    ``exp(-FLOOR)``), its ``logsumexp`` (``top + log`` of the weights summed a ``COLUMNS`` block at a
    time, as :func:`_block_logsumexp` sums a head's, so that a head whose term is zero has exactly
    the direct path's), its target's logit, and which rows are scored."""

    logits: Float[Tensor, "rows d_out"]
    top: Float[Tensor, " rows"]
    weights: Float[Tensor, "rows d_out"]
    lse: Float[Tensor, " rows"]
    target: Int[Tensor, " rows"]
    target_logit: Float[Tensor, " rows"]
    kept: Tensor

    @classmethod
    def of(cls, logits: Float[Tensor, "rows d_out"], wanted: Int[Tensor, " rows"]) -> _Direct:
        logits, target = logits.contiguous(), wanted.clamp(min=0)
        top = logits.amax(1)
        shifted = logits - top[:, None]
        weights = shifted.masked_fill_(shifted < -FLOOR, -torch.inf).exp_()
        total = torch.zeros_like(top)
        for first in range(0, logits.shape[1], COLUMNS):
            total += weights[:, first : first + COLUMNS].sum(1)
        target_logit = logits.gather(1, target[:, None])[:, 0]
        return cls(logits, top, weights, top + total.log(), target, target_logit, wanted != IGNORE)

    def loss_sum(self) -> float:
        return float(((self.lse - self.target_logit) * self.kept).double().sum())

    def sequence_losses(self, scored: _Scored, batch: int) -> Float[Tensor, " batch"]:
        """Each sequence's summed cross-entropy (float64) of the direct path, run 0's loss, read off
        these logits (a second unembedding of the same stream would cost as much again)."""
        per_row = (self.lse - self.target_logit)[self.kept].double()
        total = torch.zeros(batch, dtype=torch.float64, device=per_row.device)
        return total.index_add_(0, scored[2][self.kept], per_row)


def _first_order(
    model: AttnOnlyTransformer,
    frozen: Frozen,
    layer: int,
    stream: Tensor,
    direct: _Direct,
    scored: _Scored,
    buffer: Float[Tensor, "heads_d_head d_out"],
) -> tuple[float, list[float]]:
    """How much the loss falls when ``layer``'s first-order terms (each head reading ``stream``) are
    added to the direct path: ``(all of the layer's heads, [each head alone])``, against the direct
    path's loss computed the same way (so a head whose term is zero has exactly 0).

    With the final LayerNorm's scale ``s`` frozen the logits are affine in the stream, so a head's
    write ``z_h @ W_O^h`` adds ``(z_h / s) @ M_h`` to them, ``M_h = LN_lin(W_O^h) @ W_U``
    (``[d_head, d_out]``; the paper, column vectors: ``W_U W_O^h z_h``): one rank-``d_head`` product
    per head instead of a full unembedding of its write. Each loss is ``logsumexp`` minus the
    target's logit, the ``logsumexp`` combined over blocks of columns. ``buffer`` receives the
    ``M_h`` (one buffer for every layer: a fresh one would cost its page faults each time)."""
    block = model.blocks[layer]
    x = _affine_read(block.ln1, frozen.scales.get(norm_name(layer, "ln1")), stream)
    z = block.attn.head_values(x, None, frozen.patterns[layer])[0].transpose(
        1, 2
    )  # [batch, pos, n_heads, d_head]
    final = frozen.scales.get(norm_name(None, "ln_final"))
    z = z if final is None else z / final[..., None]
    unit = torch.ones((), dtype=z.dtype, device=z.device)
    out = block.attn.W_O
    if block.ln1_post is not None:  # a post-attention norm's frozen scale divides z; its weight joins W_O
        z = z / frozen.scales[norm_name(layer, "ln1_post")][..., None]
        out = block.ln1_post.linear(out, unit)
    z = _rows(z, scored[0])  # [rows, n_heads, d_head]
    out = out if model.ln_final is None else model.ln_final.linear(out, unit)
    n_heads, d_head, d_model = out.shape
    through = torch.matmul(out.reshape(-1, d_model), model.W_U, out=buffer).unflatten(
        0, (n_heads, d_head)
    )  # M_h, [n_heads, d_head, d_out]
    column_square = torch.zeros_like(through[:, 0])  # ||M_h[:, j]||^2, one d_head row at a time (in cache)
    for coordinate in through.unbind(1):
        column_square.addcmul_(coordinate, coordinate)
    reach = z.norm(dim=2) * column_square.amax(1).sqrt()  # [rows, n_heads]: |z_h @ M_h| at most
    sums = torch.zeros(n_heads + 1, dtype=torch.float64, device=z.device)
    for rows in row_blocks(len(direct.logits), ROWS):
        lse = _block_logsumexp(direct, rows, z[rows], through, reach[rows].amax(0) <= REACH)
        heads = einsum(z[rows], through[:, :, direct.target[rows]], "row head d, head d row -> head row")
        logit = direct.target_logit[rows] + torch.cat([heads, heads.sum(0, keepdim=True)])
        sums += ((lse - logit) * direct.kept[rows]).double().sum(1)
    count, base = int(direct.kept.sum()), direct.loss_sum()
    losses = [(base - total) / count for total in sums.tolist()]
    return losses[-1], losses[:-1]


def _block_logsumexp(
    direct: _Direct,
    rows: slice,
    z: Float[Tensor, "rows n_heads d_head"],
    through: Float[Tensor, "n_heads d_head d_out"],
    small: Tensor,
) -> Float[Tensor, "heads_and_layer rows"]:
    """``logsumexp`` over the outputs of the direct path's logits plus ``z_h @ through[h]`` for each
    head ``h``, then plus every head's, ``COLUMNS`` at a time: summed in exp space for the heads
    whose terms are ``small`` (at most ``REACH``), else by ``logsumexp`` (see ``REACH``)."""
    base, weights, n_heads = direct.logits[rows], direct.weights[rows], z.shape[1]
    lse = torch.full((n_heads + 1, len(base)), -torch.inf, dtype=base.dtype, device=base.device)
    sums = torch.zeros((n_heads, len(base)), dtype=base.dtype, device=base.device)
    fast = small.tolist()
    bits = z * LOG2E  # each head's terms in bits: t log2 e (see LOG2E)
    # Every head's block is written into the same scratch: a fresh 4 MiB block per head came from the
    # system page by page each time (blocks from 1 MiB up are mapped apart, machine.return_freed_blocks),
    # and at Llama-3.2-1B's shape those page faults took more time than the products.
    scratch = torch.empty((2, len(base) * COLUMNS), dtype=base.dtype, device=base.device)
    for first in range(0, base.shape[1], COLUMNS):
        cols = slice(first, first + COLUMNS)
        width = min(COLUMNS, base.shape[1] - first)
        every, delta = (part[: len(base) * width].view(len(base), width) for part in scratch)
        every.copy_(base[:, cols])
        for head in range(n_heads):
            torch.matmul(bits[:, head], through[head, :, cols], out=delta)
            every.add_(delta, alpha=LN2)
            if fast[head]:
                sums[head] += delta.exp2_().mul_(weights[:, cols]).sum(1)
            else:
                lse[head] = torch.logaddexp(lse[head], logsumexp_(delta.mul_(LN2).add_(base[:, cols])))
        lse[-1] = torch.logaddexp(lse[-1], logsumexp_(every))
    lse[:-1][small] = direct.top[rows] + sums[small].log()
    return lse


def _rerun(
    model: AttnOnlyTransformer,
    frozen: Frozen,
    start: Tensor,
    inputs: Sequence[Tensor] | None,
    known: Sequence[Tensor] = (),
) -> tuple[Tensor, list[Tensor], list[Tensor]]:
    """One frozen run whose heads read ``inputs`` (one stream per layer) instead of their own
    stream (no heads when ``inputs`` is None), with every MLP's write frozen; returns the final
    stream, the stream each layer saw (for the next run) and each layer's heads' write. ``known``:
    the writes of the first ``len(known)`` layers, computed before from these same streams, so
    taken as they are (see :func:`term_importance`)."""
    resid, seen, writes = start, [], []
    for layer, block in enumerate(model.blocks):
        seen.append(resid)
        if inputs is not None:
            write = known[layer] if layer < len(known) else _layer_write(model, frozen, layer, inputs[layer])
            writes.append(write)
            resid = resid + write
            constant = bias_write(model, frozen, layer, resid)
            if constant is not None:
                resid = resid + constant
        if block.mlp is not None:
            resid = resid + frozen.mlp_writes[layer]
    return resid, seen, writes


def term_importance_flop(cfg: Config, length: int) -> float:
    """FLOP per token of :func:`term_importance` on sequences of ``length``: the run that freezes
    the model, the frozen layers of every head's values and output (run ``n`` of ``n_layers``
    computes its last ``n_layers - n + 1`` layers, and the first-order effects each layer once
    more), one unembedding per order's loss (``1 + n_layers``), and a rank-``d_head`` product per
    head for the first-order losses. Not per token, so not counted: each layer's ``M_h``
    (``n_heads d_head x d_model x d_vocab_out`` multiply-adds)."""
    heads = cfg.n_heads * cfg.d_head
    frozen_layer = 2 * (2 * cfg.d_model * heads + length * heads)
    frozen_runs = (cfg.n_layers * (cfg.n_layers + 1) // 2 + cfg.n_layers) * frozen_layer
    first_order = cfg.n_layers * 2 * heads * cfg.d_out
    return forward_flop(cfg, length) + frozen_runs + (1 + cfg.n_layers) * unembed_flop(cfg) + first_order


def _order_losses(
    model: AttnOnlyTransformer, frozen: Frozen, start: Tensor, scored: _Scored
) -> tuple[list[Tensor], Tensor, list[Tensor]]:
    """:func:`term_importance`'s runs by order: the per-sequence loss sums of orders 1 to
    ``n_layers`` (run 0's are read off the direct path's logits, :class:`_Direct`), the direct
    path's final stream (run 0) and the stream each layer sees in it. Their logits' buffer
    (:func:`qkov.loss.logit_buffer`) is let go on return, before the first-order terms take theirs."""
    buffer = logit_buffer(len(scored[1]), model.W_U)
    base, inputs, writes = _rerun(model, frozen, start, None)
    first_inputs, losses = inputs, []
    for order in range(1, model.cfg.n_layers + 1):
        # A layer's stream holds paths through at most as many heads as layers before it, so run
        # n's layers below n - 1 read exactly what run n - 1's did: their writes are kept.
        resid, inputs, writes = _rerun(model, frozen, start, inputs, writes[: order - 1])
        losses.append(_sequence_losses(model, frozen, resid, scored, buffer))
    return losses, base, first_inputs


def term_importance(
    model: AttnOnlyTransformer,
    tokens: Int[Tensor, "batch pos"],
    described: str = "the given tokens",
    targets: Int[Tensor, "batch pos"] | None = None,
) -> TermImportance:
    """The paper's term importance analysis by path order (section "Term Importance Analysis").

    The attention patterns are recorded once and frozen. Run 0 is the direct path. Run ``n``
    feeds every head the stream that run ``n - 1`` computed at the head's layer, so a head's
    input holds paths through at most ``n - 1`` heads and the output paths through at most ``n``:
    ``n_layers + 1`` cheap runs instead of one per path. Biases (absent from the paper's models):
    ``b_U`` joins the direct path, and ``b_V`` and ``b_O`` count with the head or layer that adds
    them.
    The last run is the model itself, so ``loss_by_order[-1]`` is the model's loss. ``described``
    names the tokens in the result. The loss is against the next token, or against ``targets``
    (one per position, ``-100`` where there is none) when given: a model trained on a task of its
    own (:mod:`qkov.data.user_tokens`).

    GPT-2-style models: LayerNorm scales are frozen with the patterns, and every MLP's write is
    frozen at its value in the model's run and kept at every order (orders count heads; the MLP
    writes are there from run 0, each from its own layer on, so the heads of later layers read
    them). The first-order effects add one layer's (or head's) writes, reading run 0's stream,
    to run 0.
    """
    tokens = model.check_tokens(tokens)
    if targets is None and tokens.shape[1] < 2:
        raise QkovError("term importance needs sequences of at least 2 tokens (it measures next-token loss)")
    targets = None if targets is None else targets.to(model.device)
    with torch.no_grad():
        frozen = freeze(model, tokens)
        start, _ = model.embed(tokens)

        scored = _scored(tokens, targets)
        losses, base, first_inputs = _order_losses(model, frozen, start, scored)
        by_layer, by_head = [], []
        direct = _Direct.of(_rows(_unembed_affine(model, frozen, base), targets), scored[1])
        losses.insert(0, direct.sequence_losses(scored, len(tokens)))
        width = model.cfg.n_heads * model.cfg.d_head
        through = torch.empty(width, model.W_U.shape[1], dtype=model.W_U.dtype, device=model.device)
        for layer in range(model.cfg.n_layers):
            whole, heads = _first_order(model, frozen, layer, first_inputs[layer], direct, scored, through)
            by_layer.append(whole)
            by_head.append(heads)
    return _importance(losses, scored, by_layer, by_head, described)


def _importance(
    sums: list[Float[Tensor, " batch"]],
    scored: _Scored,
    by_layer: list[float],
    by_head: list[list[float]],
    described: str,
) -> TermImportance:
    """:class:`TermImportance` from each order's per-sequence loss sums: each order's loss is their
    total over every scored token, and each sequence's mean is kept for the standard errors."""
    _, wanted, sequence = scored
    counts = torch.bincount(sequence[wanted != IGNORE], minlength=len(sums[0])).to(sums[0])
    losses = [float(s.sum() / counts.sum()) for s in sums]
    some = counts > 0
    return TermImportance(
        loss_by_order=losses,
        marginal=[losses[n - 1] - losses[n] for n in range(1, len(losses))],
        first_order_by_layer=by_layer,
        first_order_by_head=by_head,
        tokens=described,
        loss_by_order_by_sequence=[(s[some] / counts[some]).tolist() for s in sums],
        scored_by_sequence=counts[some].long().tolist(),
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
    model = circuit_model(model)
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
