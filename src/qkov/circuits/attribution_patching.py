"""The first-order estimate of every head ablation at once, from one forward and one backward pass
(attribution patching: Nanda 2023, "Attribution Patching"; Syed, Rager and Conmy 2023, "Attribution
Patching Outperforms Automated Circuit Discovery"), beside exact reruns of the ablations it ranks
highest (section "Two-Layer Attention-Only Transformers": ablating a head, :mod:`.ablation`).

Replacing head ``h``'s write ``r_h`` (``blocks.{l}.attn.hook_result``, one ``d_model`` row vector per
position; the paper writes the column vector ``W_O^h z_h``, we the row ``z_h @ W_O^h``) by ``r'_h``
changes a scalar metric ``m`` by

    m(r') - m(r)  ~  sum over batch and positions of  dm/dr_h . (r'_h - r_h),

the first-order term of its Taylor series, where ``dm/dr_h`` is the total derivative through every
later layer. It is computed in ``d_head`` space: ``r_h = z_h @ W_O^h`` (``hook_z``), and both
ablations move ``z_h`` (``r'_h = z'_h @ W_O^h`` with ``z'_h`` zero or its mean: the mean is linear),
so ``dm/dr_h . (r'_h - r_h) = dm/dz_h . (z'_h - z_h)`` with ``dm/dz_h = dm/dr_h @ W_O^h^T``. The
backward then holds every layer's ``z`` and its gradient, not its head writes: ``d_model / d_head``
times less (32 at Llama-3.2-1B's shapes, where the writes and their gradients at 8 x 130 tokens
were 8.1 GiB). One backward pass gives it for every head and both ablations (``r' = 0``, and ``r'`` the
head's mean write over the batch at each position, :mod:`.ablation`'s ``"mean"``). The estimate is
exact when ``m`` is affine in the head writes (a one-layer attention-only model with a metric
linear in the logits); softmax, LayerNorm and the cross-entropy make it an approximation otherwise,
so the ablations it ranks highest are rerun exactly and the agreement is stated (:class:`AblationEstimate`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from jaxtyping import Float, Int
from torch import Tensor

from qkov.circuits.ablation import MODES, AblationEffect
from qkov.circuits.budget import forward_flop
from qkov.config import Config
from qkov.data.random_tokens import repeat_slices
from qkov.loss import token_losses
from qkov.model import AttnOnlyTransformer
from qkov.names import head_name

METHOD = "attribution_patching"
EXACT_AT_LEAST = 4  # the ablations the estimate ranks highest are rerun exactly, at least this many
METRIC = "mean next-token loss over the repeats (the mean of loss_per_repeat)"


def repeats_loss(
    logits: Float[Tensor, "batch pos d_vocab"], tokens: Int[Tensor, "batch pos"], period: int, start: int = 0
) -> Float[Tensor, ""]:
    """The mean over the repeats of :func:`qkov.data.random_tokens.loss_per_repeat` (every repeat
    has ``period - 1`` predictions, so also the mean over their positions), read from ``start`` on,
    as a differentiable scalar."""
    by_position = token_losses(logits[:, start:-1], tokens[:, start + 1 :]).mean(0)
    return torch.stack([by_position[s].mean() for s in repeat_slices(len(by_position), period)]).mean()


def attribution_patching(
    model: AttnOnlyTransformer,
    tokens: Int[Tensor, "batch pos"],
    metric: Callable[[Tensor], Tensor],
) -> tuple[float, Float[Tensor, "mode n_layers n_heads"]]:
    """``(metric's clean value, estimates)``: for each mode of :data:`.ablation.MODES` (zero, mean)
    and head, the first-order estimate of the change in ``metric(logits)`` (a scalar) when that
    head's write is replaced by zero or by its mean over the batch of ``tokens`` at each position,
    from one forward and one backward pass (the module docstring). The gradients reach the heads'
    ``z`` only: no weight gradient is computed."""
    tokens = model.check_tokens(tokens)
    zs: list[Tensor] = []

    def keep(z: Tensor, hook) -> Tensor:
        # With frozen weights (the explorer's, or ``requires_grad_(False)``) nothing before the
        # first layer's z needs a gradient: it becomes the graph's leaf. Later z depend on it, so
        # they stay in the graph and every path between heads is kept.
        if not z.requires_grad:
            z = z.detach().requires_grad_()
        zs.append(z)
        return z

    with torch.enable_grad():
        hooks = [(lambda name: name.endswith("hook_z"), keep)]
        logits, _ = model.run_with_cache(tokens, fwd_hooks=hooks, names_filter=[])
        value = metric(logits)
        grads = torch.autograd.grad(value, zs)
    estimates = []
    for z, grad in zip(zs, grads, strict=True):
        z = z.detach()
        zero = -(grad * z).sum((0, 1, 3))
        mean = (grad * (z.mean(0) - z)).sum((0, 1, 3))  # the per-position mean
        estimates.append(torch.stack([zero, mean]))
    return float(value.detach()), torch.stack(estimates, dim=1)  # [mode, n_layers, n_heads]


def attribution_flop(cfg: Config, length: int) -> float:
    """FLOP per token of :func:`attribution_patching`: the forward, and a backward to the
    activations only (one product per product of the forward)."""
    return 2 * forward_flop(cfg, length)


def estimate_and_rerun_flop(cfg: Config, length: int) -> float:
    """FLOP per token of the estimate, the clean run the exact reruns start from, and
    ``EXACT_AT_LEAST`` reruns at most a forward each: what the ablations' batch is cut to."""
    return attribution_flop(cfg, length) + (1 + EXACT_AT_LEAST) * forward_flop(cfg, length)


@dataclass(frozen=True)
class Attribution:
    """The estimate on one batch (``tokens``, repeating every ``period`` positions from ``start``),
    before any exact rerun: the clean metric and ``estimates[mode, layer, head]``."""

    tokens: Tensor
    period: int
    start: int
    described: str
    clean: float
    estimates: Tensor

    def ranking(self) -> list[tuple[str, str]]:
        """Every ``(head, mode)`` by the size of its estimated change, largest first."""
        keys = _keys(self.estimates)
        return [keys[i] for i in self.estimates.abs().flatten().argsort(descending=True, stable=True)]


def estimate_ablations(
    model: AttnOnlyTransformer, tokens: Int[Tensor, "batch pos"], period: int, start: int, described: str
) -> Attribution:
    """:func:`attribution_patching` of :func:`repeats_loss` on repeated tokens."""
    clean, estimates = attribution_patching(
        model, tokens, partial(repeats_loss, tokens=tokens, period=period, start=start)
    )
    return Attribution(tokens, period, start, described, clean, estimates.cpu())


@dataclass(frozen=True)
class EstimatedAblation:
    """One ablation's change in the metric: ``estimated`` (first order), and ``exact`` (a rerun of
    the model with the head ablated, the mean of its ``loss_change``) where it was rerun, else
    None."""

    head: str
    mode: str
    estimated: float
    exact: float | None = None


@dataclass(frozen=True)
class AblationEstimate:
    """Every ablation's estimated change in ``metric`` by ``method`` on ``tokens`` (``sequences`` x
    ``period`` x repeats after ``start``; ``clean``: the metric unablated), largest first, with the
    exact change where the ablation was rerun (``exact``: how many; ``Results.ablation`` holds those
    reruns in full). ``rank_correlation``: Spearman's rho between the estimated and the exact
    changes over the rerun ablations (None below 3)."""

    method: str
    metric: str
    tokens: str
    sequences: int
    period: int
    start: int
    clean: float
    exact: int
    rank_correlation: float | None
    ablations: list[EstimatedAblation]


def ablation_estimate(attribution: Attribution, effects: list[AblationEffect]) -> AblationEstimate:
    """The estimate beside the exact reruns ``effects`` (of ablations on the same batch)."""
    exact = {(e.head, e.mode): sum(e.loss_change) / len(e.loss_change) for e in effects}
    values = dict(zip(_keys(attribution.estimates), attribution.estimates.flatten().tolist(), strict=True))
    rows = [EstimatedAblation(h, m, values[h, m], exact.get((h, m))) for h, m in attribution.ranking()]
    pairs = [(r.estimated, r.exact) for r in rows if r.exact is not None]
    return AblationEstimate(
        method=METHOD,
        metric=METRIC,
        tokens=attribution.described,
        sequences=attribution.tokens.shape[0],
        period=attribution.period,
        start=attribution.start,
        clean=attribution.clean,
        exact=len(pairs),
        rank_correlation=spearman(*zip(*pairs, strict=True)) if len(pairs) >= 3 else None,
        ablations=rows,
    )


def _keys(estimates: Tensor) -> list[tuple[str, str]]:
    """``(head, mode)`` of each entry of ``estimates.flatten()``."""
    modes, n_layers, n_heads = estimates.shape
    heads = [head_name(layer, head) for layer in range(n_layers) for head in range(n_heads)]
    return [(name, MODES[mode]) for mode in range(modes) for name in heads]


def spearman(x: tuple[float, ...], y: tuple[float, ...]) -> float:
    """Spearman's rank correlation of at least 2 pairs (tied values ranked in their given order)."""
    ranks = [torch.tensor(v, dtype=torch.float64, device="cpu").argsort().argsort().double() for v in (x, y)]
    a, b = (r - r.mean() for r in ranks)
    return float((a * b).sum() / (a.square().sum() * b.square().sum()).sqrt())
