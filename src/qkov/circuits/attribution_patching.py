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
so ``dm/dr_h . (r'_h - r_h) = dm/dz_h . (z'_h - z_h)`` with ``dm/dz_h = dm/dr_h @ W_O^h^T``: a
layer's ``z`` and its gradient, not its head writes, ``d_model / d_head`` times less (32 at
Llama-3.2-1B's shapes). The backward goes a layer at a time (:func:`attribution_patching`), so that
it never holds more than one layer's graph. One backward pass gives it for every head and both
ablations (``r' = 0``, and ``r'`` the head's mean write over the batch at each position,
:mod:`.ablation`'s ``"mean"``). The estimate is exact when ``m`` is affine in the head writes (a
one-layer attention-only model with a metric linear in the logits); softmax, LayerNorm and the
cross-entropy make it an approximation otherwise, so the ablations it ranks highest are rerun
exactly and the agreement is stated (:class:`AblationEstimate`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial

import torch
from jaxtyping import Float, Int
from torch import Tensor

from qkov.circuits.ablation import MODES, AblationEffect, CleanRun, clean_run
from qkov.circuits.budget import forward_flop
from qkov.config import Config
from qkov.data.random_tokens import repeat_slices
from qkov.loss import token_losses
from qkov.model import AttnOnlyTransformer
from qkov.names import head_name, hook_name

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
    cache: Mapping[str, Tensor] | None = None,
) -> tuple[float, Float[Tensor, "mode n_layers n_heads"]]:
    """``(metric's clean value, estimates)``: for each mode of :data:`.ablation.MODES` (zero, mean)
    and head, the first-order estimate of the change in ``metric(logits)`` (a scalar) when that
    head's write is replaced by zero or by its mean over the batch of ``tokens`` at each position,
    from one forward and one backward pass (the module docstring). The gradients reach the heads'
    ``z`` and the residual stream only: no weight gradient is computed.

    The backward goes a layer at a time, from the streams entering each layer (kept by the forward,
    ``[batch, pos, d_model]`` each): each layer is run again from its stream and its graph taken back
    to that stream and its ``z``, then let go. The gradient reaching a layer's output carries every
    later path, so the estimates are those of one backward through the whole run, to float
    rounding, while the memory holds one layer's graph instead of every layer's weights and
    activations (which was over 10 GiB at Llama-3.2-1B's shapes on 8 x 130 tokens). One more
    forward's worth of work.

    ``cache``: the clean run's activations when the caller has them (every layer's
    ``hook_resid_pre`` and the last layer's ``hook_resid_post``, as
    :func:`~qkov.circuits.ablation.clean_run` keeps them), so that its forward is not run again."""
    tokens = model.check_tokens(tokens)
    n_layers = model.cfg.n_layers
    streams = [hook_name(layer, "resid_pre") for layer in range(n_layers)]
    final = hook_name(n_layers - 1, "resid_post")
    with torch.no_grad():
        if cache is None:
            _, cache = model.run_with_cache(tokens, names_filter=[*streams, final], return_type=None)
        cache = {name: cache[name] for name in (*streams, final)}  # ours, let go a layer at a time
        qk_positions = model.embed(tokens)[1]
    with torch.enable_grad():
        resid = cache.pop(final).detach().requires_grad_()
        value = metric(model.unembed(resid))
        (grad,) = torch.autograd.grad(value, resid)
    estimates = []
    for layer in reversed(range(n_layers)):
        grad, z, z_grad = _layer_backward(model, layer, cache.pop(streams[layer]), qk_positions, grad)
        zero = -(z_grad * z).sum((0, 1, 3))
        mean = (z_grad * (z.mean(0) - z)).sum((0, 1, 3))  # the per-position mean
        estimates.append(torch.stack([zero, mean]))
    return float(value.detach()), torch.stack(estimates[::-1], dim=1)  # [mode, n_layers, n_heads]


def _layer_backward(
    model: AttnOnlyTransformer,
    layer: int,
    resid: Float[Tensor, "batch pos d_model"],
    qk_positions: Tensor | None,
    grad: Float[Tensor, "batch pos d_model"],
) -> tuple[Tensor, Float[Tensor, "batch pos n_heads d_head"], Float[Tensor, "batch pos n_heads d_head"]]:
    """``layer`` run again from ``resid``, the stream entering it, and ``grad`` (the metric's
    gradient with respect to the stream after it) taken back through it: ``(the gradient with
    respect to resid, the layer's z, the gradient with respect to z)``."""
    kept: list[Tensor] = []

    def keep(z: Tensor, hook) -> None:
        kept.append(z)

    with torch.enable_grad():
        resid = resid.detach().requires_grad_()
        out = model.block_with_hooks(layer, resid, qk_positions, [(hook_name(layer, "z"), keep)])
        resid_grad, z_grad = torch.autograd.grad(out, [resid, kept[0]], grad)
    return resid_grad, kept[0].detach(), z_grad


def attribution_flop(cfg: Config, length: int) -> float:
    """FLOP per token of :func:`attribution_patching`: the forward, and a backward to the
    activations only (one product per product of the forward)."""
    return 2 * forward_flop(cfg, length)


def estimate_and_rerun_flop(cfg: Config, length: int) -> float:
    """FLOP per token of the estimate (its forward, the clean run that the exact reruns start from,
    and its backward), the forward again that the backward runs a layer at a time, and
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
    # held for the exact reruns (every layer's stream and z: 280 MB at Llama-3.2-1B's shapes on 8 x
    # 130 tokens); not compared, not shown
    clean_run: CleanRun = field(repr=False, compare=False)

    def ranking(self) -> list[tuple[str, str]]:
        """Every ``(head, mode)`` by the size of its estimated change, largest first."""
        keys = _keys(self.estimates)
        return [keys[i] for i in self.estimates.abs().flatten().argsort(descending=True, stable=True)]


def estimate_ablations(
    model: AttnOnlyTransformer, tokens: Int[Tensor, "batch pos"], period: int, start: int, described: str
) -> Attribution:
    """:func:`attribution_patching` of :func:`repeats_loss` on repeated tokens, from the clean run
    that the exact reruns then start from (:func:`.ablation.clean_run`, held in the result): one
    forward for both."""
    run = clean_run(model, tokens, period, start)
    metric = partial(repeats_loss, tokens=tokens, period=period, start=start)
    clean, estimates = attribution_patching(model, tokens, metric, run.cache)
    return Attribution(tokens, period, start, described, clean, estimates.cpu(), run)


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
