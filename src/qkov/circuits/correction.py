"""The corrected composition picture (the paper's published correction: "more attention head
composition going on", induction heads that also rely on "a head which attends to the last several
tokens"), read through the exact score attribution (:mod:`qkov.circuits.attribution`).

Three measurements, each on random tokens repeating every ``period`` positions:

1. *Several-recent-tokens heads.* The rule, fixed before any model was surveyed: a head's attention
   at offset ``o`` is its mean attention from ``dest`` to ``dest - o`` over every
   ``dest >= RECENT_WINDOW_MAX - 1`` (after a start token when there is one; on sequences shorter
   than ``RECENT_WINDOW_MAX``, every offset they have, from their last ``dest``); its *window* ``k`` is
   the fewest last tokens, the current one included (offsets ``0 .. k-1``), that hold at least
   :data:`RECENT_MASS` of its attention, or None when ``RECENT_WINDOW_MAX`` do not. Its *key
   position share* is the share of the variation of its scores (:func:`variance_share`) carried by
   the key side's positional parts (``pos_embed`` and earlier heads' ``.pos``): the head picks its
   sources by where they are. It is a several-recent-tokens head when its window is 2 to
   ``RECENT_WINDOW_MAX``, no single offset holds :data:`SPREAD` of its attention (else it is a
   previous-token or current-token head), and its key position share is at least
   :data:`POSITIONAL_KEY_SHARE`.
2. *Each earlier head's part in an induction head's score.* The induction head's margin on the
   target (:func:`~qkov.circuits.attribution.induction_target_shares`) split by writer: an earlier
   head's *key share* sums the shares of every term whose key part is one of its parts (``L0H3``,
   ``L0H3.pos``, ``L0H3.bias``, ``L0H3.mlp``), its *query share* those whose query part is. Over
   all key parts the key shares sum to 1; ``beyond_previous`` is the key share of the earlier heads
   that are not previous-token heads.
3. *The minimal circuit's share of the induction behaviour* (the naive hypothesis of causal
   scrubbing, Chan et al. 2022: the induction head's query reads the current token, its key the
   previous-token head's write of its source's token, its value the token). With every attention
   pattern frozen at the model's own and the LayerNorm scales the head reads frozen, each induction
   head's write is replaced by what the minimal circuit gives: scores ``q_embed . k_prev`` (the
   ``embed`` query part against the previous-token heads' token parts, no bias), their causal
   softmax, times the token embedding through its OV, ``A LN_lin(W_E[t]) W_V W_O`` (paper:
   ``A ⊗ W_OV W_E``). The loss on the repeated part (next-token loss at every ``dest >= start +
   period``) gives

       share = (loss_without - loss_minimal) / (loss_without - loss_full)

   with ``loss_without`` the induction heads' writes removed (zero), ``loss_full`` the model's.
   1 means the minimal circuit recovers all the induction heads do; the causal-scrubbing write-up
   reports 35% for this naive hypothesis and 89% for a refined one on a 2-layer attention-only
   model (Chan et al., "Causal Scrubbing", 2022; their share is the same ratio against resampling
   ablation rather than zero).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import torch
from jaxtyping import Int
from torch import Tensor

from qkov.circuits.attribution import (
    EMBED,
    POS_EMBED,
    POSITION,
    ScoreParts,
    induction_target_shares,
    layer_read,
    score_parts,
    variance_share,
)
from qkov.circuits.budget import forward_flop
from qkov.circuits.heads import pattern_offset_attention
from qkov.circuits.mechanisms import induction_mechanism_flop
from qkov.circuits.paths import Frozen, _linear_read, freeze, post_linear
from qkov.config import Config
from qkov.loss import token_losses
from qkov.model import AttnOnlyTransformer
from qkov.names import head_name, head_names, norm_name, parse_head
from qkov.numbers import finite

RECENT_WINDOW_MAX = 8
RECENT_MASS = 0.9  # an even spread over k <= 9 tokens has window exactly k
SPREAD = 0.5
POSITIONAL_KEY_SHARE = 0.5


@dataclass(frozen=True)
class RecentHead:
    """One head by the rule of the module docstring: ``offsets[o]`` its mean attention at offset
    ``o`` (``0 .. RECENT_WINDOW_MAX - 1``, fewer on shorter sequences), ``window`` its ``k``
    (None: more than the maximum), ``key_position_share`` the share of its score variation from
    positional key parts (None when its scores do not vary), ``recent`` whether it is a
    several-recent-tokens head."""

    head: str
    window: int | None
    offsets: list[float]
    key_position_share: float | None
    recent: bool


@dataclass(frozen=True)
class WriterShares:
    """One induction head's margin on the induction target split by earlier head (module
    docstring, 2): ``key`` and ``query`` shares by head name, ``previous_token`` the key share of
    the previous-token heads together, ``beyond_previous`` that of the other earlier heads (None:
    a zero margin)."""

    head: str
    key: dict[str, float | None]
    query: dict[str, float | None]
    previous_token: float | None
    beyond_previous: float | None


@dataclass(frozen=True)
class MinimalCircuit:
    """The minimal circuit's share of the induction heads' effect on the loss (module docstring, 3):
    losses in nats on the repeated part; ``share`` None when removing the heads changes nothing."""

    induction_heads: list[str]
    previous_token_heads: list[str]
    loss_full: float
    loss_minimal: float
    loss_without: float
    share: float | None


@dataclass(frozen=True)
class Correction:
    """The corrected composition picture: every head's recency (``heads``; the several-recent-tokens
    heads by name in ``recent_heads``), each induction head's writers (``writers``) and the minimal
    circuit (None without an induction head and a previous-token head in an earlier layer), on
    ``tokens`` of ``period``; the rule's constants beside them."""

    heads: list[RecentHead]
    recent_heads: list[str]
    writers: list[WriterShares]
    minimal: MinimalCircuit | None
    tokens: str
    period: int
    window_max: int = RECENT_WINDOW_MAX
    recent_mass: float = RECENT_MASS
    spread: float = SPREAD
    positional_key_share: float = POSITIONAL_KEY_SHARE


def parts_of(writer: str, names: list[str]) -> list[int]:
    """The indices of ``writer``'s parts among ``names`` (``L0H3`` and ``L0H3.<origin>``)."""
    return [i for i, name in enumerate(names) if name == writer or name.startswith(writer + ".")]


def scores_from(parts: ScoreParts, queries: list[int], keys: list[int]) -> Tensor:
    """The scores ``[batch, dest, src]`` of the given query parts against the given key parts."""
    return parts.queries[queries].sum(0) @ parts.keys[keys].sum(0).mT


def recent_head(parts: ScoreParts, pattern: Tensor, start: int) -> RecentHead:
    """One head's :class:`RecentHead` from its score parts and its pattern ``[batch, dest, src]``."""
    pattern = pattern[:, start:, start:]
    horizon = min(RECENT_WINDOW_MAX, pattern.shape[-1])  # a shorter sequence has fewer offsets
    offsets = [float(pattern_offset_attention(pattern[:, None], o, horizon - 1)[0]) for o in range(horizon)]
    reached = [k for k, mass in enumerate(accumulate(offsets), start=1) if mass >= RECENT_MASS]
    window = reached[0] if reached else None
    everything = list(range(len(parts.names)))
    positional = [i for i, n in enumerate(parts.names) if n == POS_EMBED or n.endswith(POSITION)]
    total = scores_from(parts, everything, everything)[:, start:, start:]
    share = (
        finite(variance_share(scores_from(parts, everything, positional)[:, start:, start:], total))
        if positional
        else 0.0
    )
    recent = (
        window is not None
        and window >= 2
        and max(offsets) < SPREAD
        and share is not None
        and share >= POSITIONAL_KEY_SHARE
    )
    return RecentHead(parts.head, window, [round(o, 4) for o in offsets], share, recent)


def writer_shares(parts: ScoreParts, period: int, earlier: list[str], previous: list[str]) -> WriterShares:
    """:class:`WriterShares` of one induction head (its score parts) on tokens of ``period``."""
    target = induction_target_shares(parts, period)
    defined = target.margin != 0 and bool(torch.isfinite(target.shares).all())
    shares = target.shares.nan_to_num(0.0)
    key = {w: float(shares[:, parts_of(w, parts.names)].sum()) for w in earlier}
    query = {w: float(shares[parts_of(w, parts.names)].sum()) for w in earlier}

    def known(value: float) -> float | None:
        return value if defined else None

    return WriterShares(
        head=parts.head,
        key={w: known(v) for w, v in key.items()},
        query={w: known(v) for w, v in query.items()},
        previous_token=known(sum(key[w] for w in earlier if w in previous)),
        beyond_previous=known(sum(key[w] for w in earlier if w not in previous)),
    )


def minimal_write(
    model: AttnOnlyTransformer, tokens: Tensor, head: str, previous: list[str], frozen: Frozen
) -> Tensor:
    """The write ``[batch, pos, d_model]`` of ``head`` in the minimal circuit (module docstring, 3)."""
    layer, index = parse_head(head, model.cfg)
    parts = score_parts(model, tokens, head, frozen)
    scores = scores_from(parts, [parts.names.index(EMBED)], [parts.names.index(w) for w in previous])
    n = tokens.shape[1]
    causal = torch.ones(n, n, dtype=torch.bool, device=scores.device).tril()
    pattern = scores.masked_fill(~causal, float("-inf")).softmax(-1)
    block = model.blocks[layer]
    x = _linear_read(block.ln1, frozen.scales.get(norm_name(layer, "ln1")), model.W_E[tokens])
    return post_linear(
        model, frozen, layer, pattern @ (x @ block.attn.W_V[index]) @ block.attn.W_O[index], False
    )


def repeated_part_loss(logits: Tensor, tokens: Tensor, period: int, start: int) -> float:
    """The mean next-token loss at every ``dest >= start + period`` (the repeats after the first)."""
    return float(token_losses(logits[:, :-1], tokens[:, 1:])[:, start + period :].mean())


@torch.no_grad()
def minimal_circuit(
    model: AttnOnlyTransformer,
    tokens: Int[Tensor, "batch pos"],
    period: int,
    induction: list[str],
    previous: list[str],
    start: int = 0,
) -> MinimalCircuit | None:
    """:class:`MinimalCircuit` of the ``induction`` heads, each keyed by the ``previous``-token
    heads of earlier layers (None when some induction head has none)."""
    tokens = model.check_tokens(tokens)
    frozen = freeze(model, tokens)
    feeding = {h: [p for p in previous if parse_head(p)[0] < parse_head(h)[0]] for h in induction}
    if not induction or not all(feeding.values()):
        return None
    minimal = {h: minimal_write(model, tokens, h, feeding[h], frozen) for h in induction}

    def loss(replace: dict[str, Tensor | None]) -> float:
        def edit(layer: int, writes: Tensor) -> Tensor:
            writes = writes.clone()
            for h, write in replace.items():
                at, index = parse_head(h)
                if at == layer:
                    writes[:, :, index] = 0.0 if write is None else write
            return writes

        logits, _ = model.run_with_cache(tokens, patterns=frozen.patterns, edit_writes=edit, names_filter=[])
        return repeated_part_loss(logits, tokens, period, start)

    full = loss({})
    without = loss(dict.fromkeys(induction))
    kept = loss(minimal)
    share = (without - kept) / (without - full) if without != full else None
    used = sorted({p for ps in feeding.values() for p in ps}, key=parse_head)
    return MinimalCircuit(induction, used, full, kept, without, None if share is None else finite(share))


def correction_flop(cfg: Config, length: int) -> float:
    """FLOP per token of :func:`correction`: every head's score parts (counted as the induction
    mechanism's, for all heads), and the minimal circuit's three frozen runs."""
    heads = cfg.n_layers * cfg.n_heads
    return induction_mechanism_flop(cfg, length, heads) + 3 * forward_flop(cfg, length)


@torch.no_grad()
def correction(
    model: AttnOnlyTransformer,
    tokens: Int[Tensor, "batch pos"],
    period: int,
    induction: list[str] | str,
    previous: list[str] | str,
    described: str = "repeated random tokens",
    start: int = 0,
) -> Correction:
    """The corrected composition picture (module docstring) on ``tokens``, random tokens repeating
    every ``period`` positions after ``start`` positions (1 after a start token), for the given
    ``induction`` and ``previous``-token heads (one name is one head)."""
    induction, previous = head_names(induction), head_names(previous)
    tokens = model.check_tokens(tokens)
    frozen = freeze(model, tokens)
    cfg = model.cfg
    heads, writers = [], []
    for layer in range(cfg.n_layers):
        read = layer_read(model, tokens, layer, frozen)  # one per layer serves all its heads
        for index in range(cfg.n_heads):
            name = head_name(layer, index)
            parts = score_parts(model, tokens, name, frozen, read)
            heads.append(recent_head(parts, frozen.patterns[layer][:, index], start))
            if name in induction:
                earlier = [head_name(w, h) for w in range(layer) for h in range(cfg.n_heads)]
                writers.append(writer_shares(parts, period, earlier, previous))
    return Correction(
        heads=heads,
        recent_heads=[h.head for h in heads if h.recent],
        writers=writers,
        minimal=minimal_circuit(model, tokens, period, induction, previous, start),
        tokens=described,
        period=period,
    )
