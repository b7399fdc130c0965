"""Ablating a head: replace its write to the residual stream by zero or by its mean, and see what
breaks downstream (section "Two-Layer Attention-Only Transformers": without the previous-token head
there is no induction).

The write is ``blocks.{l}.attn.hook_result`` of the model as given, ``(A (x W_V + b_V)) W_O``: the
value bias is part of it, so zero ablation removes the whole head, as on the raw model. (A model
whose value biases were folded into ``b_O``, as TransformerLens' ``fold_value_biases`` and
:func:`qkov.interop.fold.fold` do, keeps ``b_V W_O`` there when the head is zeroed: ablate the model
before folding.) The modes, as the field defines them:

- ``"mean"`` (the default, as TransformerLens users and the ARENA solutions compute it): the
  head's mean write over the batch, at each position;
- ``"batch-mean"``: its mean over the batch and every position (one vector);
- ``"zero"``: nothing written.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from qkov.circuits.budget import forward_flop, layer_flop, unembed_flop
from qkov.circuits.heads import after_start, induction_scores, pattern_offset_attention
from qkov.config import Config
from qkov.data.random_tokens import loss_per_repeat
from qkov.errors import QkovError
from qkov.hooks import patterns_only
from qkov.loss import logit_buffer, token_losses
from qkov.model import AttnOnlyTransformer
from qkov.names import head_name, hook_name, parse_head

MODES = ("zero", "mean")  # what analyze runs: zero and the per-position mean
CHOICES = ("zero", "mean", "batch-mean")
MEANINGS = {
    "zero": "replaced by zero (the value bias included)",
    "mean": "replaced by its mean over the batch at each position",
    "batch-mean": "replaced by its mean over the batch and every position",
}


def check_mode(mode: str) -> str:
    if mode not in CHOICES:
        raise QkovError(f"ablation mode must be one of {', '.join(map(repr, CHOICES))}, got {mode!r}")
    return mode


def replacement(heads: Float[Tensor, "batch pos n_heads d"], head: int, mode: str) -> Tensor | float:
    """What ``head``'s slice of ``heads`` (every head's ``z``, ``hook_z``, or write) becomes under
    ``mode`` (:data:`CHOICES`), broadcastable to ``heads[:, :, head]``: 0, its per-position mean
    ``[pos, d]`` over the batch, or its mean over batch and positions ``[d]``. The ablations replace
    ``z``: its replacement's product with ``W_O^h`` is the write's."""
    if check_mode(mode) == "zero":
        return 0.0
    return heads[:, :, head].mean(0 if mode == "mean" else (0, 1))


@dataclass(frozen=True)
class RepeatBehaviour:
    """On tokens repeating every ``period`` positions: every head's induction score
    ``[n_layers][n_heads]`` and the mean next-token loss on each repeat."""

    induction: list[list[float]]
    loss_per_repeat: list[float]


def repeat_behaviour(
    logits: Tensor, cache: dict, tokens: Int[Tensor, "batch pos"], period: int, start: int = 0
) -> RepeatBehaviour:
    """The induction scores and the loss per repeat of one run, read on the positions from
    ``start`` on (``start = 1`` after a start token: the repeats themselves)."""
    logits, tokens = logits[:, start:], tokens[:, start:]
    per_repeat = loss_per_repeat(token_losses(logits[:, :-1], tokens[:, 1:]), period)
    return RepeatBehaviour(induction_scores(after_start(cache, start), period).tolist(), per_repeat)


@dataclass(frozen=True)
class CleanRun:
    """The unablated run that :func:`ablation_effects` measures the ablations against
    (:func:`clean_run`): its behaviour, and its cache of every layer's ``hook_resid_pre`` and
    ``hook_z`` (each rerun starts from its layer's) and the last layer's ``hook_resid_post``
    (:func:`~qkov.circuits.attribution_patching.attribution_patching` reads the streams)."""

    behaviour: RepeatBehaviour
    cache: dict[str, Tensor]


@torch.no_grad()
def clean_run(
    model: AttnOnlyTransformer, tokens: Int[Tensor, "batch pos"], period: int, start: int = 0
) -> CleanRun:
    """The run of ``tokens`` (repeating every ``period`` positions, read from ``start`` on) that the
    ablations are measured against: its losses formed from the final stream a block of positions
    at a time, as the ablated runs' are (:meth:`~qkov.model.Transformer.stream_losses`), and its
    patterns read for the induction scores, then let go."""
    tokens = model.check_tokens(tokens)
    final = hook_name(model.cfg.n_layers - 1, "resid_post")
    kept = ("hook_pattern", "hook_z", "hook_resid_pre")
    _, cache = model.run_with_cache(
        tokens, names_filter=lambda name: name.endswith(kept) or name == final, return_type=None
    )
    buffer = logit_buffer(tokens.shape[0] * (tokens.shape[1] - start - 1), model.W_U)
    losses = model.stream_losses(cache[final][:, start:-1], tokens[:, start + 1 :], buffer)
    induction = induction_scores(after_start(cache, start), period).tolist()
    behaviour = RepeatBehaviour(induction, loss_per_repeat(losses, period))
    return CleanRun(behaviour, {name: value for name, value in cache.items() if not name.endswith("pattern")})


@torch.no_grad()
def run_ablated(
    model: AttnOnlyTransformer,
    tokens: Int[Tensor, "batch pos"],
    layer: int,
    head: int,
    mode: str,
    clean_cache: dict | None = None,
    names_filter: str | Sequence[str] | Callable[[str], bool] | None = None,
) -> tuple[Tensor, dict]:
    """Logits and cache with head ``(layer, head)``'s write replaced as ``mode`` says
    (:func:`replacement`: ``"zero"``, ``"mean"`` per position, ``"batch-mean"``), the means taken
    over this input's unablated run (``clean_cache``, computed when not given). The head's ``z``
    is replaced (a hook on ``hook_z``): its write ``z_h @ W_O^h`` then takes the means of the
    write as the head makes it, before a norm after the attention where the model has one (whose
    scale is then the ablated layer's), as the stacked reruns (:func:`ablation_effects`) and
    :mod:`.attribution_patching` replace it. ``names_filter``: what the returned cache keeps, as
    :meth:`~qkov.model.Transformer.run_with_cache` takes it (None: every activation)."""
    z_name = hook_name(layer, "z")
    if mode == "zero":
        value = replacement(torch.empty(0), head, mode)
    else:
        clean = clean_cache
        if clean is None:
            clean = model.run_with_cache(tokens, names_filter=z_name, return_type=None)[1]
        value = replacement(clean[z_name], head, mode)

    def ablate(z: Tensor, hook: object) -> Tensor:
        z = z.clone()
        z[:, :, head] = value
        return z

    return model.run_with_cache(tokens, fwd_hooks=[(z_name, ablate)], names_filter=names_filter)


@dataclass(frozen=True)
class AblationEffect:
    """One earlier head replaced as ``mode`` says (:data:`MEANINGS`): the change in each later head's
    induction score and in the loss on each repeat, against the clean run, on ``sequences``
    sequences of random tokens repeating every ``period`` positions (after a start token when
    ``start`` is 1)."""

    head: str
    mode: str
    induction_change: dict[str, float]
    loss_per_repeat: list[float]
    loss_change: list[float]
    sequences: int
    period: int
    start: int = 0


# Ablations that start at the same layer run stacked along the batch, up to this many tokens per
# forward: at GPT-2 small's shapes a forward of ~100 tokens ran its matrix products at a third of the
# rate of one of ~2000 (26 against 80 GFLOP/s, 2 threads, benchmarks/analyze_gpt2.py); the default
# models' batch (32 x 126 tokens) is already that large and runs one ablation at a time.
FORWARD_TOKENS = 2048


def rerun_flop(cfg: Config, length: int, layer: int) -> float:
    """FLOP per token of one ablation of a head of ``layer``: a run from that layer on, logits
    included."""
    return (cfg.n_layers - layer) * layer_flop(cfg, length) + unembed_flop(cfg)


def ablation_flop(cfg: Config, length: int) -> float:
    """FLOP per token of :func:`ablation_effects` on sequences of ``length``: the clean run, and per
    mode and head of every layer but the last, a run from the head's layer on, logits included."""
    reruns = sum(rerun_flop(cfg, length, layer) for layer in range(cfg.n_layers - 1))
    return forward_flop(cfg, length) + len(MODES) * cfg.n_heads * reruns


def within_budget(
    cfg: Config, tokens: Int[Tensor, "batch pos"], ranking: list[tuple[str, str]], budget: float, least: int
) -> list[tuple[str, str]] | None:
    """The ablations ``(head, mode)`` of ``ranking`` to rerun exactly on ``tokens`` within ``budget``
    FLOP: None (all of them) when :func:`ablation_effects` of every one fits, else the first of
    ``ranking`` whose clean run and reruns fit, at least ``least`` of them (heads of the last
    layer, which nothing reads, left out)."""
    batch, length = tokens.shape
    if batch * length * ablation_flop(cfg, length) <= budget:
        return None
    chosen, spent = [], batch * length * forward_flop(cfg, length)
    for head, mode in ranking:
        layer = parse_head(head)[0]
        cost = batch * length * rerun_flop(cfg, length, layer)
        if layer == cfg.n_layers - 1 or (len(chosen) >= least and spent + cost > budget):
            continue
        chosen.append((head, mode))
        spent += cost
    return chosen


@torch.no_grad()
def ablation_effects(
    model: AttnOnlyTransformer,
    tokens: Int[Tensor, "batch pos"],
    period: int,
    clean: CleanRun | None = None,
    start: int = 0,
    only: Collection[tuple[str, str]] | None = None,
    modes: tuple[str, ...] = MODES,
) -> list[AblationEffect]:
    """For every head of every layer but the last, ablated in each of ``modes`` (zero and the
    per-position mean by default; :data:`CHOICES`), or only the ``(head, mode)`` pairs of ``only``:
    the change in each later head's induction score and in the loss on each repeat, against the
    clean run (``clean``, :func:`clean_run` of ``tokens``, computed when not given), read on the
    positions from ``start`` on (1: after a start token).

    Each ablated run equals :func:`run_ablated`'s full rerun, but starts at the ablated head's layer
    from the clean run's residual stream there (the layers before it see nothing of the ablation),
    with the ablations of one layer stacked along the batch (``FORWARD_TOKENS`` at a time)."""
    tokens, modes = model.check_tokens(tokens), [check_mode(mode) for mode in modes]
    clean = clean or clean_run(model, tokens, period, start)
    before = clean.behaviour
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    per_forward = max(1, FORWARD_TOKENS // tokens.numel())
    buffer = logit_buffer(per_forward * tokens.shape[0] * (tokens.shape[1] - start - 1), model.W_U)
    effects = []
    for layer in range(n_layers - 1):
        ablations = [
            (head, mode)
            for head in range(n_heads)
            for mode in modes
            if only is None or (head_name(layer, head), mode) in only
        ]
        for first in range(0, len(ablations), per_forward):
            group = ablations[first : first + per_forward]
            runs = _ablated_from(model, tokens, (period, start), layer, group, clean.cache, buffer)
            for (head, mode), ablated in zip(group, runs, strict=True):
                changes = zip(ablated.loss_per_repeat, before.loss_per_repeat, strict=True)
                effects.append(
                    AblationEffect(
                        head=head_name(layer, head),
                        mode=mode,
                        induction_change={
                            head_name(later, h): ablated.induction[later][h] - before.induction[later][h]
                            for later in range(layer + 1, n_layers)
                            for h in range(n_heads)
                        },
                        loss_per_repeat=ablated.loss_per_repeat,
                        loss_change=[a - c for a, c in changes],
                        sequences=tokens.shape[0],
                        period=period,
                        start=start,
                    )
                )
    return effects


def _ablated_from(
    model: AttnOnlyTransformer,
    tokens: Int[Tensor, "batch pos"],
    repeats: tuple[int, int],
    layer: int,
    group: list[tuple[int, str]],
    clean: dict,
    buffer: Tensor,
) -> list[RepeatBehaviour]:
    """The runs with each ``(head, mode)`` of ``layer`` ablated, stacked along the batch and started
    at ``layer`` from the clean residual stream; ``induction`` holds the layers from ``layer`` on
    (earlier layers' entries are NaN: the ablation cannot reach them). ``repeats`` is the period
    and the first position of the repeats (:func:`repeat_behaviour`); ``buffer`` holds their logits,
    a block of positions at a time (:meth:`Transformer.stream_losses`)."""
    (period, start), batch, n = repeats, tokens.shape[0], len(group)
    # A head's write is z_h @ W_O^h, so replacing its z replaces its write by the same means (to
    # float rounding), with the value bias inside z: the run then never forms every head's write
    # ([runs * batch, pos, n_heads, d_model], 1.1 GiB for four runs at Llama-3.2-1B's shapes).
    z = clean[hook_name(layer, "z")]
    replacements = [replacement(z, head, mode) for head, mode in group]

    def ablate(stacked: Tensor, hook: object) -> Tensor:
        stacked = stacked.clone()
        for run, ((head, _), value) in enumerate(zip(group, replacements, strict=True)):
            stacked[run * batch : (run + 1) * batch, :, head] = value
        return stacked

    resid = clean[hook_name(layer, "resid_pre")].repeat(n, 1, 1)
    final = hook_name(model.cfg.n_layers - 1, "resid_post")
    # n runs stacked: only their patterns and final stream are read (every head's write would be n
    # times the clean run's), and their losses formed in ``buffer``, not from a logits tensor
    _, cache = model.run_with_cache(
        tokens,
        fwd_hooks=[(hook_name(layer, "z"), ablate)],
        start=(layer, resid),
        names_filter=lambda name: patterns_only(name) or name == final,
        return_type=None,
    )
    targets = tokens[:, start + 1 :].repeat(n, 1)
    losses = model.stream_losses(cache[final][:, start:-1], targets, buffer).unflatten(0, (n, batch))
    shape = (n, model.cfg.n_layers, model.cfg.n_heads)
    induction = torch.full(shape, torch.nan, dtype=losses.dtype, device=losses.device)
    for later in range(layer, model.cfg.n_layers):
        pattern = cache[hook_name(later, "pattern")][..., start:, start:].unflatten(0, (n, batch))
        induction[:, later] = pattern_offset_attention(pattern, period - 1, period)
    return [
        RepeatBehaviour(induction[run].tolist(), loss_per_repeat(losses[run], period)) for run in range(n)
    ]
