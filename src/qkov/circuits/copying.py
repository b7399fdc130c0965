"""Copying: does a head's OV circuit make an attended token raise its own logit? (section
"One-Layer Attention-Only Transformers", "Copying / Primarily Positive Eigenvalues").

Two kinds of evidence, both read off each head's full OV circuit ``M = W_E W_V W_O W_U`` (paper:
``W_U W_OV W_E``; row ``s`` is what attending to token ``s`` does to the logits):

- the paper's *eigenvalue* statistic ``Re(sum l) / sum |l|`` (:func:`copying_score`), cheap from
  the ``d_head x d_head`` reordering, with a random baseline (:func:`random_copying_scores`);
- *direct* measures over the full vocabulary (:func:`direct_copying`): the diagonal ``M[t, t]``
  (each token's effect on its own logit), its z-score within the row, the token's rank among all
  ``d_vocab`` entries of its row and how often it is the row's strict maximum (``self_top1``).

:func:`compare_copying` sets them side by side and marks the heads where they disagree: the seeds'
question "is the eigenvalue statistic a reliable test for copying?".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import numpy as np
import torch
from jaxtyping import Float, Int
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from torch import Tensor

from qkov.circuits.qk_ov import map_layers
from qkov.config import Config
from qkov.errors import QkovError
from qkov.linalg import BLOCK_BYTES, FactoredMatrix, SharedFactoredMatrix, eigenvalue_positivity
from qkov.model import AttnOnlyTransformer
from qkov.names import head_name
from qkov.numbers import finite

WILSON_Z = 1.959963984540054  # the standard normal's 97.5th percentile: a two-sided 95% interval
DEVICE_BLOCK_BYTES = 2**30  # rows scored at once on an accelerator: large matmuls keep it busy
# Direct copying is exact (every token's diagonal, every row ranked) up to this many FLOP, else
# sampled to fit it (sample_rows_for). On CPU 0.25 TFLOP, a few seconds: every default model stays
# exact (2-layer: 8.6 GFLOP of ranks). Beyond it the cost is the vocabulary: GPT-2 small's pass
# over every token's diagonal alone is 1.4 TFLOP and Llama-3.2-1B's 34 TFLOP, so those average the
# diagonal over sampled tokens with a standard error. Ranks need whole rows (2 d_vocab d_model FLOP
# per row and head in the direct form): a few rows on CPU, with Wilson intervals. A GPU's budget
# ranks thousands of rows of GPT-2 small or Llama-3.2-1B (tens of TFLOP/s).
EXACT_FLOP_BUDGET = {"cpu": 2.5e11, "cuda": 1e14}
MIN_DIAGONAL_ROWS = 1024  # sampled diagonal tokens at least: standard errors about std / 32
MIN_RANK_ROWS = 8  # ranked rows at least, however wide the vocabulary
COPYING_SCORE_THRESHOLD = 0.5  # eigenvalues "say copying" above it (see compare_copying)
DIAGONAL_Z_THRESHOLD = 1.0  # the direct measures "say copying" above it (see compare_copying)


# -- the eigenvalue statistic -------------------------------------------------------------------
def copying_score(fm: FactoredMatrix | SharedFactoredMatrix) -> Float[Tensor, "..."]:
    """``Re(sum l) / sum |l|`` over the eigenvalues ``l`` of each square matrix (section
    "Detecting Copying Behavior"): near 1 when a head's OV circuit makes tokens raise their own
    logits, near -1 when it lowers them. Defined as 0 for a zero matrix."""
    return eigenvalue_positivity(fm.eigenvalues())


def random_copying_scores(
    fm: FactoredMatrix, n_samples: int = 100, generator: torch.Generator | None = None
) -> Float[Tensor, "n_samples"]:
    """The paper's baseline: :func:`copying_score` of ``n_samples`` products of Gaussian factors
    of the same shapes as one matrix of ``fm`` (``[m, r] @ [r, m]``), whose eigenvalues spread like
    a (Ginibre) random matrix's. Compare a head's score with this distribution.

    The nonzero eigenvalues of ``A B`` are those of the ``r x r`` matrix ``B A``. Up to
    ``FACTOR_DRAW_ENTRIES`` entries per factor the factors themselves are drawn; above it (a 50k
    vocabulary: 3.2 million each) ``B A`` is drawn directly from its law, exactly
    (:func:`_reordered_gaussian_products`), at ``r^2`` numbers a draw instead of ``2 m r``."""
    fm._require_square("a copying-score baseline")
    if fm.m * fm.r > FACTOR_DRAW_ENTRIES and fm.r <= fm.m:
        small = _reordered_gaussian_products(fm.m, fm.r, n_samples, generator)
        return eigenvalue_positivity(torch.linalg.eigvals(small))
    scores = []
    for _ in range(n_samples):  # one sample at a time
        A = torch.randn(fm.m, fm.r, generator=generator, dtype=torch.float64, device="cpu")
        B = torch.randn(fm.r, fm.n, generator=generator, dtype=torch.float64, device="cpu")
        scores.append(copying_score(FactoredMatrix(A, B)))
    return torch.stack(scores)


# The baseline draws the factors themselves up to this many entries each (every default model: 4096
# tokens x 32 is 131k), which keeps their baselines as they were; a draw at GPT-2 small's 50257 x 64
# cost 0.13 s (200 draws: 26 s, all of it the Gaussian generator), the law of B A below 0.5 ms.
FACTOR_DRAW_ENTRIES = 2**20


def _reordered_gaussian_products(
    m: int, r: int, n_samples: int, generator: torch.Generator | None
) -> Float[Tensor, "n_samples r r"]:
    """``n_samples`` draws of ``B A`` for independent standard Gaussian ``A [m, r]`` and
    ``B [r, m]``, from its law rather than from the factors. Given ``A``, the rows of ``B A`` are
    independent ``N(0, A^T A)``, so ``B A`` has the law of ``G S`` with ``G [r, r]`` standard Gaussian and
    any ``S`` with ``S^T S = A^T A``; ``A^T A`` is Wishart(``m``, ``I_r``), and Bartlett's
    decomposition gives it as ``L L^T`` with ``L`` lower triangular, ``L_ii^2 ~ chi^2(m - i)``
    (``i = 0 .. r-1``) and ``N(0, 1)`` below the diagonal, so ``S = L^T``. The numbers come from a
    NumPy generator seeded from ``generator``."""
    seed = int(torch.randint(0, 2**62, (1,), generator=generator, device="cpu"))
    rng = np.random.default_rng(seed)
    L = np.tril(rng.standard_normal((n_samples, r, r)), -1)
    L[:, np.arange(r), np.arange(r)] = np.sqrt(rng.chisquare(m - np.arange(r), size=(n_samples, r)))
    G = rng.standard_normal((n_samples, r, r))
    return torch.from_numpy(G @ L.transpose(0, 2, 1))


# -- the direct measures ------------------------------------------------------------------------
@dataclass(frozen=True)
class DirectCopying:
    """One head's direct copying measures over its full OV circuit ``M`` (``d_vocab x d_vocab``).

    - ``diagonal_mean``: the mean over tokens of ``M[t, t]``;
    - ``diagonal_z``: the mean over tokens of ``(M[t, t] - mean_o M[t, o]) / std_o M[t, o]`` (the
      row's mean and population standard deviation over all ``d_vocab`` entries; 0 for a
      constant row). Each token's value is exact; the mean is over every token when
      ``diagonal_rows`` is None, else over that many tokens drawn at random without replacement,
      with standard errors ``diagonal_mean_se`` and ``diagonal_z_se`` (finite-population
      corrected; None when over every token);
    - ``self_rank_median``: the median over the scored rows of the token's 1-based rank in its
      own row, ties counted against it (``1 + #{o != t: M[t, o] >= M[t, t]}``);
    - ``self_top1``: the fraction of scored rows where the token's own logit is the row's strict
      maximum; ``self_top1_ci`` its 95% Wilson interval when the rows are a random sample (drawn
      without replacement, so the binomial interval is conservative), None when every row was
      scored (exact);
    - ``rows``: how many rows were ranked; ``exact``: whether that is all of them.
    """

    name: str
    diagonal_mean: float
    diagonal_z: float
    self_rank_median: float
    self_top1: float
    self_top1_ci: tuple[float, float] | None
    rows: int
    exact: bool
    # Defaults: a results.json written before the diagonal could be sampled averaged every token.
    diagonal_rows: int | None = None
    diagonal_mean_se: float | None = None
    diagonal_z_se: float | None = None


@torch.no_grad()
def direct_copying(
    model: AttnOnlyTransformer,
    sample_rows: int | None = None,
    device: str | torch.device | None = None,
    generator: torch.Generator | None = None,
    progress: bool = True,
    diagonal_rows: int | None = None,
) -> list[DirectCopying]:
    """Every head's :class:`DirectCopying`, layer by layer. ``sample_rows=None`` ranks every row
    (exact; ``2 d_vocab^2 d_head`` FLOP per head, 46 TFLOP for GPT-2 small: use a GPU,
    ``device="cuda"``; by default the model's device); an integer ranks that many rows drawn
    without replacement (the same rows for every head, from ``generator``), each row exact, with a
    confidence interval. ``diagonal_rows=None`` averages the diagonal over every token (one pass
    over the vocabulary, ``4 d_vocab d_model d_head`` FLOP per head, shared with the ranks); an
    integer averages it over that many tokens of the same draw, with standard errors, and the
    ranked rows are then scored without that pass. Columns stream in blocks (a progress bar on
    stderr unless ``progress=False``); no ``d_vocab x d_vocab`` matrix and no
    ``[heads, d_vocab, d_head]`` factor is built."""
    d_vocab = model.cfg.d_vocab
    for name, count in (("sample_rows", sample_rows), ("diagonal_rows", diagonal_rows)):
        if count is not None and count < 1:
            raise QkovError(f"{name} must be a positive number of rows, got {count}")
    drawn = torch.randperm(d_vocab, generator=generator, device="cpu")
    rows, diagonal_tokens = (
        None if count is None or count >= d_vocab else drawn[:count].sort().values
        for count in (sample_rows, diagonal_rows)
    )
    rows = torch.arange(d_vocab, device="cpu") if rows is None else rows
    device = model.device if device is None else torch.device(device)
    unembed_gram = []  # W_U W_U^T, once for every layer

    def one_layer(layer: int, ov: SharedFactoredMatrix) -> tuple[Tensor, Tensor, Tensor]:
        if not unembed_gram:
            W_U = ov.right.to(device)
            unembed_gram.append(W_U @ W_U.mT)
        advance = partial(shown.advance, task)
        return diagonal_and_ranks(ov, rows, device, advance, unembed_gram[0], diagonal_tokens)

    with _progress_bar(progress) as shown:
        task = shown.add_task("direct copying", total=d_vocab * model.cfg.n_layers)
        # one layer's heads at a time; under torchrun, a share of the layers in each process
        found = map_layers(model, "OV", one_layer)
    parts = (torch.cat(part, dim=-1 if i < 2 else 0) for i, part in enumerate(zip(*found, strict=True)))
    return _direct_rows(*parts, model.cfg, diagonal_tokens)


def _direct_rows(
    diagonal: Float[Tensor, "2 heads"],
    z: Float[Tensor, "2 heads"],
    ranks: Int[Tensor, "heads rows"],
    cfg: Config,
    diagonal_tokens: Tensor | None,
) -> list[DirectCopying]:
    """The typed rows from every head's (mean, standard error) pairs and ranks."""
    whole, n_heads = ranks.shape[1], cfg.n_heads
    exact = whole == cfg.d_vocab
    out = []
    for index in range(len(ranks)):
        top1 = int((ranks[index] == 1).sum())
        out.append(
            DirectCopying(
                name=head_name(*divmod(index, n_heads)),
                diagonal_mean=float(diagonal[0, index]),
                diagonal_z=float(z[0, index]),
                self_rank_median=float(ranks[index].double().quantile(0.5)),
                self_top1=top1 / whole,
                self_top1_ci=None if exact else wilson_interval(top1, whole),
                rows=whole,
                exact=exact,
                diagonal_rows=None if diagonal_tokens is None else len(diagonal_tokens),
                diagonal_mean_se=None if diagonal_tokens is None else float(diagonal[1, index]),
                diagonal_z_se=None if diagonal_tokens is None else float(z[1, index]),
            )
        )
    return out


class RowPlan(NamedTuple):
    """How much of the vocabulary :func:`direct_copying` reads: ``diagonal`` tokens for the diagonal
    statistics and ``ranks`` ranked rows, None meaning every one."""

    diagonal: int | None
    ranks: int | None


def default_direct_copying(model: AttnOnlyTransformer, progress: bool = False) -> list[DirectCopying]:
    """:func:`direct_copying` as ``qkov analyze`` runs it, on the model's device: exact within that
    device's FLOP budget, else on tokens sampled with seed 0 (:func:`sample_rows_for`)."""
    plan = sample_rows_for(model.cfg, model.device)
    gen = torch.Generator().manual_seed(0)
    return direct_copying(model, plan.ranks, generator=gen, progress=progress, diagonal_rows=plan.diagonal)


def sample_rows_for(cfg: Config, device: str | torch.device = "cpu") -> RowPlan:
    """The :class:`RowPlan` that keeps :func:`direct_copying` within ``EXACT_FLOP_BUDGET`` on
    ``device``. Every token and row when that fits; else the diagonal over every token (its pass
    over the vocabulary, ``4 d_model d_head`` FLOP per token and head, also gives the ranks their
    columns) and as many ranked rows as the rest of the budget pays for (``2 d_vocab d_head``
    each, per head) when the pass takes at most half; else half the budget to sampled diagonal
    tokens and half to ranked rows, each row then ``2 d_vocab min(d_model, ...)`` FLOP per head in
    the cheaper of its two forms (see :func:`diagonal_and_ranks`), with at least
    ``MIN_DIAGONAL_ROWS`` tokens and ``MIN_RANK_ROWS`` rows."""
    budget = EXACT_FLOP_BUDGET["cpu" if torch.device(device).type == "cpu" else "cuda"]
    heads, V, d_head, d_model = cfg.n_layers * cfg.n_heads, cfg.d_vocab, cfg.d_head, cfg.d_model
    per_token, per_row = 4 * heads * d_head * d_model, 2 * heads * d_head * V
    if V * (per_token + per_row) <= budget:
        return RowPlan(None, None)
    if V * per_token <= budget / 2:
        return RowPlan(None, min(V, int((budget - V * per_token) // per_row)))
    diagonal = min(V, max(MIN_DIAGONAL_ROWS, int(budget / 2 // per_token)))
    columns = 2 * heads * d_head * d_model * V  # every head's W_O W_U, for the factored form
    direct = int(budget / 2 // (2 * heads * d_model * V))
    factored = int((budget / 2 - columns) // per_row)
    ranks = min(V, max(MIN_RANK_ROWS, direct, factored))
    return RowPlan(None if diagonal == V else diagonal, None if ranks == V else ranks)


def wilson_interval(successes: int, trials: int, z: float = WILSON_Z) -> tuple[float, float]:
    """The Wilson score interval for a binomial proportion (95% for the default ``z``): unlike
    the normal approximation it stays inside [0, 1] and is not empty at 0 or ``trials`` successes."""
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z / (1 + z * z / trials) * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials))
    low = 0.0 if successes == 0 else max(0.0, centre - half)  # exact ends: no rounding residue
    high = 1.0 if successes == trials else min(1.0, centre + half)
    return low, high


@torch.no_grad()
def diagonal_and_ranks(
    ov: SharedFactoredMatrix,
    rows: Int[Tensor, "rows"],
    device: torch.device,
    advance: Callable[[int], object] = lambda tokens: None,
    unembed_gram: Float[Tensor, "d_model d_model"] | None = None,
    diagonal_tokens: Int[Tensor, "tokens"] | None = None,
) -> tuple[Float[Tensor, "2 heads"], Float[Tensor, "2 heads"], Int[Tensor, "heads rows"]]:
    """Every head's mean diagonal and mean diagonal z-score, each with its standard error (0 over
    every token), and the 1-based rank of each of ``rows``' own token in its row (ties against it).

    For a block of tokens ``t``, ``P = W_E[t] W_V`` and ``Q = W_U[:, t]^T W_O^T`` give the diagonal
    ``sum(P * Q)``; the row mean is ``P (W_O mean_o W_U)`` and the row's mean square
    ``P (W_O W_U W_U^T W_O^T / d_vocab) P^T``, with the Gram matrix ``W_U W_U^T`` formed once (so no
    row is built). Over every token (``diagonal_tokens=None``) one pass over blocks of columns
    serves both: the block's ``Q`` are its columns of every head's ``W_O W_U``, and the scored rows'
    ``W_E[rows] W_V`` times it are their entries there. Over sampled tokens the diagonal reads only
    those, and the ranks read each column block in the cheaper form: through ``Q`` as above, or,
    for fewer rows than about ``d_head``, as ``(W_E[rows] W_V W_O) W_U[:, block]``. Nothing
    ``d_vocab x d_vocab``, and no head's ``W_O W_U``, is built. ``advance`` gets each block's
    tokens; ``unembed_gram``: ``W_U W_U^T`` on ``device``, if the caller has it."""
    circuit = _LayerCircuits(ov, device, unembed_gram)
    diagonal, z = _Moments(circuit.heads, device), _Moments(circuit.heads, device)
    step = circuit.step
    if diagonal_tokens is not None:
        for first in range(0, len(diagonal_tokens), step):
            circuit.add_diagonal(
                circuit.factors(diagonal_tokens[first : first + step].to(device)), diagonal, z
            )
    ranks = _RankCounter(circuit, rows.to(device), factored=diagonal_tokens is None)
    for start in range(0, ov.m, step):
        columns = slice(start, start + step)
        if diagonal_tokens is None:
            P, Q = circuit.factors(columns)
            circuit.add_diagonal((P, Q), diagonal, z)
            ranks.count(columns, Q)
        else:
            ranks.count(columns, None)
        advance(min(step, ov.m - start))
    n = ov.m if diagonal_tokens is None else len(diagonal_tokens)
    return diagonal.summary(n, ov.m), z.summary(n, ov.m), ranks.ranks()


class _LayerCircuits:
    """One layer's heads' full OV circuits ``W_E W_V W_O W_U``, read a block of tokens at a time:
    heads and their ``d_head`` coordinates first, tokens last, so that each block's ``P`` and ``Q``
    come out of one matmul in the layout every later product and reduction reads contiguously."""

    def __init__(self, ov: SharedFactoredMatrix, device: torch.device, unembed_gram: Tensor | None) -> None:
        self.W_E, self.W_U, W_V, self.W_O = _head_factors(ov, device)
        self.heads, self.d_head = self.W_O.shape[:2]
        # Tokens per block: a block's P or Q is BLOCK_BYTES.
        self.step = max(1, BLOCK_BYTES // (self.heads * self.d_head * self.W_E.element_size()))
        self.mean_direction = (self.W_O @ self.W_U.mean(1))[:, None, :]  # [heads, 1, d_head]
        gram = self.W_U @ self.W_U.mT if unembed_gram is None else unembed_gram
        self.second_moment = self.W_O @ gram @ self.W_O.mT / ov.n  # [heads, d_head, d_head]
        self.W_V_t, self.W_O_t = W_V.flatten(1).mT, self.W_O.flatten(0, 1)  # [heads * d_head, d_model]

    def factors(self, tokens: Tensor | slice) -> tuple[Tensor, Tensor]:
        """``P`` and ``Q`` of these tokens, each ``[heads, d_head, tokens]``."""
        P = (self.W_V_t @ self.W_E[tokens].mT).unflatten(0, (self.heads, self.d_head))
        return P, self.columns(tokens)

    def columns(self, tokens: Tensor | slice) -> Tensor:
        """These tokens' columns of every head's ``W_O W_U``, as ``[heads, d_head, tokens]``."""
        return (self.W_O_t @ self.W_U[:, tokens]).unflatten(0, (self.heads, self.d_head))

    def add_diagonal(self, PQ: tuple[Tensor, Tensor], diagonal: _Moments, z: _Moments) -> None:
        """The block's diagonal entries and their z-scores within their rows, into the sums."""
        P, Q = PQ
        entries = (P * Q).sum(1)  # [heads, b]
        mean = (self.mean_direction @ P)[:, 0]
        square = ((self.second_moment @ P) * P).sum(1)  # second_moment is symmetric
        std = (square - mean.square()).clamp_min(0).sqrt()
        diagonal.add(entries)
        z.add(torch.where(std > 0, (entries - mean) / torch.where(std > 0, std, 1), 0))


class _Moments:
    """Per-head running sums of a statistic and of its square, in float64."""

    def __init__(self, heads: int, device: torch.device) -> None:
        self.sum = torch.zeros(heads, dtype=torch.float64, device=device)
        self.square = torch.zeros(heads, dtype=torch.float64, device=device)

    def add(self, values: Float[Tensor, "heads b"]) -> None:
        values = values.double()
        self.sum += values.sum(1)
        self.square += values.square().sum(1)

    def summary(self, n: int, population: int) -> Float[Tensor, "2 heads"]:
        """The mean of ``n`` values drawn without replacement from ``population``, and its standard
        error: the sample variance over ``n``, times the finite-population correction (0 when
        ``n == population``)."""
        mean = self.sum / n
        variance = ((self.square - n * mean.square()) / max(n - 1, 1)).clamp_min(0)
        return torch.stack([mean, (variance / n * (1 - n / population)).sqrt()]).cpu()


class _RankCounter:
    """How many entries of each scored row are at least its own, over column blocks: through each
    block's ``Q`` (``factored``), or as ``(P_rows W_O) W_U[:, block]`` when that is cheaper."""

    def __init__(self, circuit: _LayerCircuits, rows: Tensor, factored: bool) -> None:
        self.circuit, self.rows = circuit, rows
        P_rows, Q_rows = circuit.factors(rows)
        self.own = (P_rows * Q_rows).sum(1)[..., None]  # [heads, rows, 1]: each row's own entry
        P_rows = P_rows.transpose(1, 2).contiguous()  # [heads, rows, d_head]
        d_model, r = circuit.W_E.shape[1], len(rows)
        self.factored = factored or r * d_model >= circuit.d_head * (d_model + r)
        self.left = P_rows if self.factored else P_rows @ circuit.W_O  # [heads, rows, d_head | d_model]
        # Counted in floating point, exact below 2^24 columns (in float32 or wider).
        dtype = torch.promote_types(circuit.W_E.dtype, torch.float32)
        self.counts = torch.zeros(circuit.heads, r, dtype=dtype, device=rows.device)
        block_bytes = BLOCK_BYTES if rows.device.type == "cpu" else DEVICE_BLOCK_BYTES
        width = min(circuit.step, circuit.W_E.shape[0])  # the column blocks' width
        self.row_step = max(1, block_bytes // (circuit.heads * width * circuit.W_E.element_size()))

    def count(self, columns: slice, Q: Tensor | None) -> None:
        """Count this block of columns; ``Q`` its columns of ``W_O W_U`` when already made."""
        if self.factored:
            right = self.circuit.columns(columns) if Q is None else Q  # [heads, d_head, b]
        else:
            right = self.circuit.W_U[:, columns]  # [d_model, b], the same for every head
        for first in range(0, len(self.rows), self.row_step):
            scored = slice(first, first + self.row_step)
            entries = self.left[:, scored] @ right  # [heads, rows, b]
            local = self.rows[scored] - columns.start  # a row's own column, when in this block
            inside = ((local >= 0) & (local < entries.shape[-1])).nonzero()[:, 0]
            entries[:, inside, local[inside]] = -torch.inf  # the own entry is not counted against itself
            self.counts[:, scored] += entries.ge_(self.own[:, scored]).sum(-1, dtype=self.counts.dtype)

    def ranks(self) -> Int[Tensor, "heads rows"]:
        return (self.counts.long() + 1).cpu()


def _head_factors(ov: SharedFactoredMatrix, device: torch.device) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``W_E``, ``W_U`` on the device, and every head's ``W_V`` ``[d_model, heads, d_head]`` and
    ``W_O`` ``[heads, d_head, d_model]`` flattened over layers."""
    W_V = ov.inner.A.flatten(0, 1).permute(1, 0, 2)
    W_O = ov.inner.B.flatten(0, 1)
    return ov.left.to(device), ov.right.to(device), W_V.to(device), W_O.to(device)


def _progress_bar(show: bool) -> Progress:
    counter = TextColumn("{task.completed}/{task.total} tokens")
    columns = (TextColumn("{task.description}"), BarColumn(), counter, TimeElapsedColumn())
    columns += (TimeRemainingColumn(),)
    return Progress(*columns, console=Console(stderr=True), disable=not show)


# -- the eigenvalue statistic of every head, against its baseline -------------------------------
@dataclass(frozen=True)
class HeadCopying:
    """One head's full OV circuit ``W_E W_V W_O W_U`` (paper: ``W_U W_OV W_E``): its eigenvalue copying
    score ``Re(sum l) / sum |l|`` (None when undefined), the eigenvalues ``(re, im)`` it is computed
    from (rounded to 5 decimals), and whether the score is above the random baseline's 99th
    percentile (``copies``). The direct measures are :class:`DirectCopying`, by the same head name."""

    name: str
    layer: int
    head: int
    copying_score: float | None
    eigenvalues: list[tuple[float, float]]
    copies: bool


@dataclass(frozen=True)
class Copying:
    """Copying (section "Copying / Primarily Positive Eigenvalues"): every head, and the scores of
    random factors of the same shapes (``baseline``, :func:`random_copying_scores`); a head copies
    above ``threshold``, the baseline's 99th percentile; ``copying_heads`` of them do."""

    heads: list[HeadCopying]
    baseline: list[float]
    baseline_mean: float
    threshold: float
    copying_heads: int


@torch.no_grad()
def copying_analysis(model: AttnOnlyTransformer, baseline_samples: int = 200) -> Copying:
    """Every head's copying score, from float64 eigenvalues of the ``d_head x d_head`` reordering
    of its full OV circuit (nothing ``d_vocab x d_vocab`` is built), against the scores of
    ``baseline_samples`` random Gaussian factors of the first head's shapes (seed 0)."""
    # each layer's weights read in turn, not kept; under torchrun, each process's share of the layers
    by_layer = map_layers(model, "OV", lambda layer, ov: ov.eigenvalues(torch.float64).cpu())
    shapes = (model.cfg.d_vocab, model.cfg.d_head), (model.cfg.d_head, model.cfg.d_out)
    first = FactoredMatrix(*(torch.empty(shape, device="meta") for shape in shapes))  # its shapes alone
    baseline = random_copying_scores(first, baseline_samples, torch.Generator().manual_seed(0))
    eigenvalues = torch.cat(by_layer)
    scores = eigenvalue_positivity(eigenvalues)
    threshold = float(baseline.quantile(0.99))
    heads = [
        HeadCopying(
            name=head_name(layer, head),
            layer=layer,
            head=head,
            copying_score=finite(scores[layer, head]),
            eigenvalues=[(round(e.real, 5), round(e.imag, 5)) for e in eigenvalues[layer, head].tolist()],
            copies=bool(scores[layer, head] > threshold),
        )
        for layer, head in np.ndindex(scores.shape)
    ]
    return Copying(
        heads=heads,
        baseline=[round(float(x), 4) for x in baseline],
        baseline_mean=float(baseline.mean()),
        threshold=threshold,
        copying_heads=sum(h.copies for h in heads),
    )


# -- the comparison -----------------------------------------------------------------------------
@dataclass(frozen=True)
class CopyingComparison:
    """One head's eigenvalue verdict beside its direct verdict (see :func:`compare_copying`); the
    numbers behind them are the head's :class:`HeadCopying` and :class:`DirectCopying`."""

    name: str
    eigenvalues_say_copying: bool
    direct_says_copying: bool
    disagree: bool


def compare_copying(copying: Copying, direct: list[DirectCopying]) -> list[CopyingComparison]:
    """Every head's eigenvalue copying score (:func:`copying_analysis`) against its direct measures
    (:func:`direct_copying`), with a verdict from each.

    The rule: eigenvalues say "copying" when ``copying_score > COPYING_SCORE_THRESHOLD`` (0.5:
    positive eigenvalues outweigh the rest three to one; random Gaussian heads stay well below it:
    the 99th percentile of :func:`random_copying_scores` is 0.185 at d_head 16 and 0.053 at d_head 64,
    d_vocab 4096, benchmarks/spectra.py); the direct measures say "copying" when
    ``diagonal_z > DIAGONAL_Z_THRESHOLD`` (1.0: on average a token's own logit is raised one standard
    deviation of its row above the row's mean; the 144 random heads of GPT-2 small's shapes give
    ``|diagonal_z| <= 0.014``, a head with ``M = I`` gives ``sqrt(d_vocab - 1)``). An undefined score
    (a zero circuit) says "not copying". The heads where the verdicts differ (``disagree``) are where
    the eigenvalue statistic and the logits tell different stories: positive eigenvalues of a matrix
    far from diagonal (a shear, ``I + 10 N``), or a strong diagonal beside eigenvalues that large
    off-diagonal rotations make complex."""
    by_name = {row.name: row for row in direct}
    if sorted(by_name) != sorted(h.name for h in copying.heads):
        raise QkovError("the copying scores and the direct measures are of different heads")
    out = []
    for h in copying.heads:
        eigenvalues_say = (h.copying_score or 0.0) > COPYING_SCORE_THRESHOLD
        direct_says = by_name[h.name].diagonal_z > DIAGONAL_Z_THRESHOLD
        out.append(CopyingComparison(h.name, eigenvalues_say, direct_says, eigenvalues_say != direct_says))
    return out
