"""Q-, K- and V-composition between heads of different layers (section "Three Kinds of
Composition"), and the token-level K-composition term behind induction heads.

A later head ``h2`` can read what an earlier head ``h1`` wrote through its queries, keys or
values. The paper measures how much with (column vectors, ``W_QK = W_Q^T W_K``, ``W_OV = W_O W_V``)

- Q: ``‖W_QK^h2T W_OV^h1‖_F / (‖W_QK^h2‖_F ‖W_OV^h1‖_F)``
- K: ``‖W_QK^h2  W_OV^h1‖_F / (‖W_QK^h2‖_F ‖W_OV^h1‖_F)``
- V: ``‖W_OV^h2  W_OV^h1‖_F / (‖W_OV^h2‖_F ‖W_OV^h1‖_F)``

In qkov's row-vector form (``qk = W_Q W_K^T``, ``ov = W_V W_O``) the numerators are
``‖ov1 qk2‖``, ``‖ov1 qk2^T‖`` and ``‖ov1 ov2‖`` (each the transpose of the paper's product).

Computed small: with ``R`` a square root of a factor's Gram matrix (``R^T R = W^T W``, ``d_head x
d_head``), ``‖W_V1 W_O1 W_Q2 W_K2^T‖ = ‖R_V1 W_O1 W_Q2 R_K2^T‖``, a ``d_head x d_head`` matrix per
pair, so all pairs of a 144-head model take one matrix product per later layer.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import torch
from einops import rearrange
from jaxtyping import Complex, Float
from torch import Tensor

from qkov.circuits.copying import Copying
from qkov.errors import QkovError
from qkov.interop.fold import circuit_model
from qkov.linalg import FactoredMatrix, eigenvalue_positivity, float64_gram, gram_root
from qkov.model import AttnOnlyTransformer
from qkov.names import head_name, parse_head

KINDS = ("Q", "K", "V")
BASELINE_SAMPLES = 100
# The writers' rows (R_V W_O, d_head x d_model per head) kept at once: Llama-3.1-8B's shapes hold 8
# layers (64 MiB each in float32), so its 32 layers are read in 4 passes
WRITER_BYTES = 2**29
TOP_PAIRS = 32  # the strongest pairs of each kind Composition.top keeps, for a reader of a big model
# A product of every writer's rows with every reader's columns, as one d_head x d_head block per pair.
PAIR_BLOCKS = (
    "(layer_from head_from d_head) (head_to d_head_to) -> layer_from head_from head_to d_head d_head_to"
)


def _gram_root(X: Float[Tensor, "... d_model d_head"]) -> Float[Tensor, "... d_head d_head"]:
    """A square root ``R`` of the Gram matrix, ``R^T R = X^T X`` (:func:`qkov.linalg.gram_root` in
    float64, so rank-deficient ``X`` is fine). Then ``‖X Z‖_F = ‖R Z‖_F`` for any ``Z``, since
    ``‖X Z‖_F^2 = tr(Z^T X^T X Z)``: a ``d_model x d_head`` factor can be replaced by ``d_head x d_head``.
    """
    gram = (X.mT @ X).double()  # the product in X's own precision (float64 for float64 weights)
    return gram_root(gram, X.shape[-1]).to(X.dtype)


def raw_composition_scores(
    model: AttnOnlyTransformer, kind: str
) -> Float[Tensor, "layer_from head_from layer_to head_to"]:
    """The paper's composition score of one kind, without a baseline; NaN where
    ``layer_from >= layer_to``."""
    return all_raw_composition_scores(model, (kind,))[kind]


def all_raw_composition_scores(
    model: AttnOnlyTransformer, kinds: tuple[str, ...] = KINDS, memory_bytes: int = WRITER_BYTES
) -> dict[str, Float[Tensor, "layer_from head_from layer_to head_to"]]:
    """Raw scores of several kinds at once, sharing the Gram roots of ``W_Q``, ``W_K``, ``W_V``
    and ``W_O^T``.

    For ``h1 -> h2`` the numerator is ``‖left[h1] @ right[h2]‖_F`` with ``left = R_V1 W_O1``
    (``[d_head, d_model]``) and ``right`` = ``W_Q2 R_K2^T`` (Q), ``W_K2 R_Q2^T`` (K) or
    ``W_V2 R_O2^T`` (V); the denominators are ``‖R_V R_O^T‖`` (the OV norm) and ``‖R_Q R_K^T‖``
    (the QK norm).

    The writers' ``left`` rows are the only thing kept across layers: as many layers of them as fit
    in ``memory_bytes`` at a time, each such group met by every later layer in one pass over the
    layers, so that a model read layer by layer (:mod:`qkov.interop.lazy`) is scored in memory
    bounded by the budget and one layer, not by its depth (a deep model's layers are read once per
    group).
    """
    model = circuit_model(model)
    for kind in kinds:
        if kind not in KINDS:
            raise QkovError(f"composition kind must be one of Q, K, V, got {kind!r}")
    cfg = model.cfg
    shape = (cfg.n_layers, cfg.n_heads, cfg.n_layers, cfg.n_heads)
    scores = {kind: torch.full(shape, math.nan, dtype=model.W_E.dtype, device=model.device) for kind in kinds}
    per_layer = cfg.n_heads * cfg.d_head * cfg.d_model * model.W_E.element_size()
    with torch.no_grad():
        for writers in writer_groups(cfg.n_layers, per_layer, memory_bytes):
            _score_writer_group(model, kinds, writers, scores)
    return scores


def writer_groups(n_layers: int, per_layer: int, memory_bytes: int) -> list[range]:
    """The writer layers (every layer but the last) in groups of as many as ``memory_bytes`` holds
    at ``per_layer`` bytes each (one at least): a pass over the later layers per group."""
    size = max(1, memory_bytes // per_layer)
    return [range(first, min(first + size, n_layers - 1)) for first in range(0, n_layers - 1, size)]


def _layer_factors(attn, needed: set[str]) -> dict[str, Tensor]:
    """One layer's weights as ``[n_heads, d_model, d_head]`` factors (``W_O`` transposed), and the
    Gram roots (``R`` + name) of those in ``needed``."""
    W = {name: getattr(attn, f"W_{name}").detach() for name in "QKV"}
    W["O"] = attn.W_O.detach().mT
    return W | {"R" + name: _gram_root(W[name]) for name in needed}


def _score_writer_group(
    model: AttnOnlyTransformer, kinds: tuple[str, ...], writers: range, scores: dict[str, Tensor]
) -> None:
    """Fill ``scores`` for every writer in the layers ``writers`` and every reader after it: one pass
    over the layers from the group's first, each read once (as a writer, then as a reader)."""
    cfg, fro = model.cfg, torch.linalg.matrix_norm
    needed = {"V", "O"} | ({"Q", "K"} if {"Q", "K"} & set(kinds) else set())
    # the group's writers: R_V W_O rows, [layer_from, (head_from d_head), d_model], and their OV norms
    like = dict(dtype=model.W_E.dtype, device=model.device)  # a narrow model's W_E has no data to copy
    left = torch.empty(len(writers), cfg.n_heads * cfg.d_head, cfg.d_model, **like)
    ov_norms = torch.empty(len(writers), cfg.n_heads, **like)
    for layer in range(writers.start, cfg.n_layers):
        f = _layer_factors(model.blocks[layer].attn, needed)
        ov_norm = fro(f["RV"] @ f["RO"].mT)
        held = min(layer, writers.stop) - writers.start  # the group's writers before this layer
        for kind in kinds if held else ():  # a reader of the group's writers
            reads, partner = {"Q": ("Q", "K"), "K": ("K", "Q"), "V": ("V", "O")}[kind]
            reader_norm = ov_norm if kind == "V" else fro(f["RQ"] @ f["RK"].mT)
            right = rearrange(
                f[reads] @ f["R" + partner].mT, "head_to d_model d_head_to -> d_model (head_to d_head_to)"
            )
            for i in range(held):  # one writer layer at a time: what is built does not grow with depth
                # every pair (a head of the writer layer, a head of this one) in one matrix product,
                # whose d_head x d_head blocks are the pairs' products
                pair_products = rearrange(
                    (left[i] @ right).square_(), PAIR_BLOCKS,
                    layer_from=1, head_from=cfg.n_heads, head_to=cfg.n_heads,
                )  # fmt: skip
                numerator = pair_products.sum((-1, -2)).sqrt()[0]
                scores[kind][writers.start + i, :, layer] = numerator / (ov_norms[i][:, None] * reader_norm)
        if layer in writers:
            left[held] = rearrange(f["RV"] @ f["O"].mT, "n_heads d_head d_model -> (n_heads d_head) d_model")
            ov_norms[held] = ov_norm


@lru_cache(maxsize=32)
def random_composition_scores(d_model: int, d_head: int, samples: int = BASELINE_SAMPLES) -> Tensor:
    """The raw composition scores of ``samples`` pairs of random heads of these shapes: over
    ``samples`` pairs of circuits ``X1 Y1`` and ``X2 Y2`` with Gaussian ``X [d_model, d_head]`` and
    ``Y [d_head, d_model]``, of ``‖X1 Y1 X2 Y2‖_F / (‖X1 Y1‖_F ‖X2 Y2‖_F)``, drawn from a fixed seed
    (so deterministic; float32 is ample for an average of 100 draws). The same for Q, K and V,
    since a random QK and a random OV circuit have the same distribution. The paper subtracts it;
    TransformerLens does not.
    """
    generator = torch.Generator().manual_seed(0)
    fro = torch.linalg.matrix_norm
    scores = []
    for start in range(0, samples, 25):  # in chunks: bounded memory at GPT-2 shapes
        n = min(25, samples - start)
        draws = (torch.randn(n, d_model, d_head, generator=generator, device="cpu") for _ in range(4))
        X1, Y1T, X2, Y2T = draws
        R_X1, R_Y1, R_X2, R_Y2 = (_gram_root(M) for M in (X1, Y1T, X2, Y2T))
        numerator = fro(R_X1 @ Y1T.mT @ X2 @ R_Y2.mT)  # ‖X1 Y1 X2 Y2‖ = ‖R_X1 Y1 X2 R_Y2^T‖
        scores.append(numerator / (fro(R_X1 @ R_Y1.mT) * fro(R_X2 @ R_Y2.mT)))
    return torch.cat(scores)


def composition_baseline(d_model: int, d_head: int, samples: int = BASELINE_SAMPLES) -> float:
    """The expected raw composition score of random heads of these shapes: the mean of
    :func:`random_composition_scores` (the baseline the paper subtracts)."""
    return float(random_composition_scores(d_model, d_head, samples).mean())


def composition_baseline_sd(d_model: int, d_head: int, samples: int = BASELINE_SAMPLES) -> float:
    """The standard deviation of :func:`random_composition_scores`: how far a random pair's score
    strays from the baseline, the unit in which a measured pair's distance from chance is read."""
    return float(random_composition_scores(d_model, d_head, samples).std())


def composition_scores(
    model: AttnOnlyTransformer, kind: str, subtract_baseline: bool = True
) -> Float[Tensor, "layer_from head_from layer_to head_to"]:
    """Q-, K- or V-composition scores for every pair of heads in different layers, indexed
    ``[layer_from, head_from, layer_to, head_to]``, NaN where ``layer_from >= layer_to``.

    With ``subtract_baseline`` (the paper's default), the expected score of random matrices of the
    same shapes (:func:`composition_baseline`) is subtracted, so about 0 means "no more than
    chance"; without it the raw score, as TransformerLens' ``all_composition_scores`` gives it. The
    same pairs labelled by head name (``L0H1`` into ``L1H2``), beside the baseline and its spread,
    drawn in a notebook: :func:`composition`.
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
    model = circuit_model(model)
    cfg = model.cfg
    (layer1, head1), (layer2, head2) = parse_head(writer, cfg), parse_head(reader, cfg)
    if layer1 >= layer2:
        raise QkovError(f"{writer} must be in an earlier layer than {reader} to K-compose with it")
    writer_attn, reader_attn = model.blocks[layer1].attn, model.blocks[layer2].attn
    queries = model.W_E @ reader_attn.W_Q[head2] * cfg.d_head**-0.5
    keys = model.W_E @ writer_attn.W_V[head1] @ writer_attn.W_O[head1] @ reader_attn.W_K[head2]
    return FactoredMatrix(queries, keys.mT)


def k_composition_positivity(
    model: AttnOnlyTransformer, memory_bytes: int = WRITER_BYTES
) -> Float[Tensor, "layer_from head_from layer_to head_to"]:
    """:func:`qkov.copying_score` of every :func:`k_composition_circuit`, NaN where
    ``layer_from >= layer_to``: near +1 for an induction head reading a previous-token head.

    The term is ``W_E W_Q2 W_K2^T W_O1^T W_V1^T W_E^T`` (row vectors, scale left out: it does not
    change the sign of an eigenvalue); its nonzero eigenvalues are those of the ``d_head x d_head``
    reordering ``(W_O1 W_K2)^T (W_V1^T G W_Q2)``, with the token Gram matrix ``G = W_E^T W_E`` formed
    once, so nothing vocabulary-sized, and nothing ``d_model x d_model`` per pair, is built. All in
    float64; the writers' ``W_V`` and ``W_O`` kept as :func:`all_raw_composition_scores` keeps its
    rows, ``memory_bytes`` of them at a time (in the weights' dtype, widened one layer at a time)."""
    model = circuit_model(model)
    cfg = model.cfg
    shape = (cfg.n_layers, cfg.n_heads, cfg.n_layers, cfg.n_heads)
    out = torch.full(shape, math.nan, dtype=torch.float64, device=model.device)
    per_layer = 2 * cfg.n_heads * cfg.d_head * cfg.d_model * model.W_E.element_size()
    with torch.no_grad():
        gram = float64_gram(model.outer_factors()[0])  # W_E^T W_E, d_model x d_model
        for writers in writer_groups(cfg.n_layers, per_layer, memory_bytes):
            _positivity_writer_group(model, gram, writers, out)
    return out


def _positivity_writer_group(model: AttnOnlyTransformer, gram: Tensor, writers: range, out: Tensor) -> None:
    """Fill ``out`` for every writer in the layers ``writers`` and every reader after it, in one pass
    over the layers from the group's first (see :func:`k_composition_positivity`). Under
    grouped-query attention the circuit view repeats each key and value head over its group: the
    products with ``W_V1`` and ``W_K2`` are then made once per group (``group`` equal heads) and
    repeated, a quarter of the work at Llama 3's 4 query heads per key head."""
    cfg = model.cfg
    # each writer layer's W_V^T (one per group of equal heads) and W_O, as [(head d_head), d_model]
    values_in, keys_out, value_groups = [], [], []
    readers = "head_to d_model d_head_to -> d_model (head_to d_head_to)"
    for layer in range(writers.start, cfg.n_layers):
        attn = model.blocks[layer].attn
        held = min(layer, writers.stop) - writers.start  # the group's writers before this layer
        if held:
            queries = rearrange(gram @ attn.W_Q.double(), readers)  # W_E^T W_E W_Q2
            key_group = repeated_heads(attn.W_K)
            keys_to = rearrange(attn.W_K[::key_group].double(), readers)
        for i in range(held):  # one writer layer at a time: what is built does not grow with depth
            values = _repeat_heads(values_in[i].double() @ queries, value_groups[i], cfg.d_head, 0)
            keys = _repeat_heads(keys_out[i].double() @ keys_to, key_group, cfg.d_head, 1)  # W_O1 W_K2
            keys_blocks, values_blocks = (
                rearrange(x, PAIR_BLOCKS, layer_from=1, head_from=cfg.n_heads, head_to=cfg.n_heads)
                for x in (keys, values)
            )
            small = (keys_blocks.mT @ values_blocks).flatten(0, 2)  # [pairs, d_head, d_head]
            scores = eigenvalue_positivity(_eigvals(small))
            out[writers.start + i, :, layer] = scores.reshape(cfg.n_heads, cfg.n_heads)
        if layer in writers:
            value_groups.append(repeated_heads(attn.W_V))
            W_V = attn.W_V[:: value_groups[-1]]
            values_in.append(
                rearrange(W_V, "n_heads d_model d_head -> (n_heads d_head) d_model").contiguous()
            )
            keys_out.append(rearrange(attn.W_O, "n_heads d_head d_model -> (n_heads d_head) d_model").clone())


def repeated_heads(W: Float[Tensor, "n_heads ..."]) -> int:
    """The largest ``g`` such that the heads come in runs of ``g`` equal matrices (a circuit view's
    key or value heads under grouped-query attention, each repeated over its group); 1 if none."""
    n = W.shape[0]
    for g in sorted((g for g in range(2, n + 1) if n % g == 0), reverse=True):
        runs = W.unflatten(0, (n // g, g))
        if torch.equal(runs, runs[:, :1].expand_as(runs)):
            return g
    return 1


def _repeat_heads(x: Tensor, group: int, d_head: int, dim: int) -> Tensor:
    """``x`` with each head's ``d_head`` rows (``dim=0``) or columns (``dim=1``) repeated ``group``
    times: a product made once per group of equal heads, for every head of the group."""
    if group == 1:
        return x
    return x.unflatten(dim, (-1, d_head)).repeat_interleave(group, dim).flatten(dim, dim + 1)


def _eigvals(matrices: Float[Tensor, "batch k k"]) -> Complex[Tensor, "batch k"]:
    """``torch.linalg.eigvals`` of a batch split across torch's threads on the CPU (each LAPACK call
    is sequential; the same results, in half the time on 2 cores); one call elsewhere."""
    threads = max(1, min(torch.get_num_threads(), len(matrices)))
    if threads == 1 or matrices.device.type != "cpu":
        return torch.linalg.eigvals(matrices)
    with ThreadPoolExecutor(threads) as pool:
        return torch.cat(list(pool.map(torch.linalg.eigvals, matrices.chunk(threads))))


# -- the typed results of the analysis ----------------------------------------------------------
@dataclass(frozen=True)
class CompositionPair:
    """How much an earlier head (``writer``) composes into a later one (``reader``): the raw score
    (as TransformerLens reports it), the random baseline, and ``score = raw - baseline``."""

    writer: str
    reader: str
    raw: float
    baseline: float
    score: float


@dataclass(frozen=True)
class Composition:
    """Q-, K- and V-composition of every earlier head into every later one (section "Two-Layer
    Attention-Only Transformers"), against ``baseline``, the expected score of random heads, and
    ``baseline_sd``, the random scores' standard deviation. What a reader of a model of hundreds of
    heads reads instead of every pair: ``top``, each kind's :data:`TOP_PAIRS` strongest pairs
    (highest ``score`` first), and ``layers``, each kind's strongest score from any head of one layer
    into any head of another (``layers[kind][writer layer][reader layer]``, None unless the reader's
    layer is later). Both are empty in a file written before they were kept."""

    baseline: float
    Q: list[CompositionPair]
    K: list[CompositionPair]
    V: list[CompositionPair]
    baseline_sd: float | None = None
    top: dict[str, list[CompositionPair]] = field(default_factory=dict)
    layers: dict[str, list[list[float | None]]] = field(default_factory=dict)


def strongest_pairs(
    raw: Float[Tensor, "layer_from head_from layer_to head_to"],
    baseline: float,
    k: int,
    writer_layer: int | None = None,
    reader_layer: int | None = None,
    offset: int = 0,
) -> tuple[list[CompositionPair], int]:
    """The pairs ranked ``offset`` to ``offset + k`` by baseline-subtracted score, highest first, of
    those whose writer is in ``writer_layer`` and reader in ``reader_layer`` (any, when None), and
    how many pairs there are of those (NaN, a reader not later than its writer, is no pair)."""
    scores = raw.detach().double().cpu() - baseline
    n_layers = scores.shape[0]
    keep = ~torch.isnan(scores)
    if writer_layer is not None:
        keep[torch.arange(n_layers) != writer_layer] = False
    if reader_layer is not None:
        keep[:, :, torch.arange(n_layers) != reader_layer] = False
    index = keep.flatten().nonzero().squeeze(1)
    values = scores.flatten()[index]
    order = values.argsort(descending=True, stable=True)[offset : offset + k]
    pairs = []
    for flat, value in zip(index[order].tolist(), values[order].tolist(), strict=True):
        l1, h1, l2, h2 = (int(i) for i in np.unravel_index(flat, scores.shape))
        pairs.append(CompositionPair(head_name(l1, h1), head_name(l2, h2), value + baseline, baseline, value))
    return pairs, int(index.numel())


def layer_maxima(
    raw: Float[Tensor, "layer_from head_from layer_to head_to"], baseline: float
) -> list[list[float | None]]:
    """The strongest baseline-subtracted score from any head of each layer into any head of each
    later one, ``[writer layer][reader layer]``; None where the reader's layer is not later."""
    scores = torch.nan_to_num(raw.detach().double().cpu(), nan=-math.inf).amax(dim=(1, 3)) - baseline
    return [[None if math.isinf(x) else x for x in row] for row in scores.tolist()]


def composition(model: AttnOnlyTransformer) -> Composition:
    """Every pair's raw score of each kind beside the paper's baseline-subtracted one, each kind's
    strongest pairs and its strongest score between each two layers."""
    baseline = composition_baseline(model.cfg.d_model, model.cfg.d_head)
    raw = all_raw_composition_scores(model, KINDS)
    pairs = {
        kind: [
            CompositionPair(head_name(l1, h1), head_name(l2, h2), float(x), baseline, float(x) - baseline)
            for (l1, h1, l2, h2), x in np.ndenumerate(scores.cpu().numpy())
            if not math.isnan(x)
        ]
        for kind, scores in raw.items()
    }
    return Composition(
        baseline=baseline, **pairs, baseline_sd=composition_baseline_sd(model.cfg.d_model, model.cfg.d_head),
        top={kind: strongest_pairs(scores, baseline, TOP_PAIRS)[0] for kind, scores in raw.items()},
        layers={kind: layer_maxima(scores, baseline) for kind, scores in raw.items()},
    )  # fmt: skip


@dataclass(frozen=True)
class InductionCheck:
    """A later head: its OV copying score and the eigenvalue positivity of its token-level
    K-composition term with the earlier head that gives the strongest (``writer``); ``all`` holds
    the positivity with every earlier head."""

    head: str
    ov_copying: float | None
    k_composition_positivity: float
    writer: str
    all: dict[str, float]


def induction_checks(model: AttnOnlyTransformer, copying: Copying) -> list[InductionCheck]:
    """The paper's two tests of an induction head (section "How Induction Heads Work") for every
    head after the first layer: a positive OV circuit (``copying``, :func:`copying_analysis`'s
    scores) and a positive token-level K-composition term with an earlier head
    (:func:`k_composition_positivity`)."""
    positivity = k_composition_positivity(model)
    scores = {h.name: h.copying_score for h in copying.heads}
    n_heads, rows = model.cfg.n_heads, []
    for layer in range(1, model.cfg.n_layers):
        for head in range(n_heads):
            per_writer = positivity[:layer, :, layer, head].flatten()  # [earlier layers * n_heads]
            best = int(per_writer.argmax())
            rows.append(
                InductionCheck(
                    head=head_name(layer, head),
                    ov_copying=scores[head_name(layer, head)],
                    k_composition_positivity=float(per_writer[best]),
                    writer=head_name(*divmod(best, n_heads)),
                    all={head_name(*divmod(i, n_heads)): float(v) for i, v in enumerate(per_writer)},
                )
            )
    return rows
