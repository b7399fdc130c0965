"""Which mechanism an induction head uses (section "How Induction Heads Work" and the paper's note
on GPT-2: one induction head there works by "pointer arithmetic" on positions, not by K-composition).

Two ways to attend from a repeated token to the token after its previous occurrence:

- *K-composition on token content*: the query reads the current token; the key reads a previous-
  token head's write, the token *before* the source; they match at the target.
- *pointer arithmetic*: an earlier head moves a position (where the earlier occurrence was, one
  step on) into the query, and the key reads the source's position: position parts on both sides
  (Q-composition with a head's positional write; only possible where values see positions, i.e.
  the standard scheme, not shortformer).

The rule (fixed before the survey of ``docs/experiments/induction-mechanism.md`` was run, and kept
whatever it found). On repeated random tokens of period ``P``, for every ``dest >= P`` the head's
*margin* is its pre-softmax score at the target ``src = dest - P + 1`` minus its mean score at the
other ``src <= dest``; the exact attribution (:mod:`qkov.circuits.attribution`) splits it into one
margin per (query part, key part) term, and a term's *share* is its mean margin (over the batch and
destinations) over the head's mean margin: signed, the shares sum to 1. The terms are grouped:

- ``k_composition``: query part ``embed`` (the current token, read directly) x key part an
  earlier head's token part (``L0H3``); ``writer`` names the earlier head whose term is largest;
- ``pointer``: both parts positional (``pos_embed`` or an earlier head's ``.pos``) and at least
  one of them an earlier head's ``.pos`` (the pointer; ``pos_embed x pos_embed`` alone is a fixed
  preference for some offsets, not a pointer);
- ``other``: every other term (bias, MLP and ``.bias`` parts, ``embed x embed``, token x position,
  ``pos_embed x pos_embed``, ...).

The mechanism is the group with the largest share when that share is at least
:data:`MECHANISM_SHARE` (one half of the margin); otherwise, or when the margin is not positive,
``other``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from jaxtyping import Int
from torch import Tensor

from qkov.circuits.attribution import EMBED, POS_EMBED, POSITION, induction_target_shares, score_parts
from qkov.circuits.budget import forward_flop
from qkov.circuits.paths import Frozen, freeze
from qkov.config import Config
from qkov.errors import QkovError
from qkov.model import AttnOnlyTransformer
from qkov.names import head_names, parse_head
from qkov.numbers import finite

MECHANISM_SHARE = 0.5
GROUPS = ("k_composition", "pointer", "other")
TOP_TERMS = 5  # the largest terms (by |share|) kept per head


@dataclass(frozen=True)
class TermShare:
    """One (query part, key part) term's share of a head's margin on the induction target."""

    query: str
    key: str
    share: float | None  # None (JSON null) when the head's margin is 0


@dataclass(frozen=True)
class InductionMechanism:
    """One induction head's mechanism by the rule of the module docstring: ``shares`` by group
    (``k_composition``, ``pointer``, ``other``; they sum to 1), ``margin`` the head's mean score
    margin on the target (pre-softmax), ``writer`` the earlier head of the largest K-composition
    term, ``top_terms`` the largest terms, and ``tokens`` what it was measured on (``period``)."""

    head: str
    mechanism: str
    shares: dict[str, float | None]
    margin: float
    writer: str | None
    top_terms: list[TermShare]
    tokens: str
    period: int


def _is_head_token_part(name: str) -> bool:
    """Whether a part is an earlier head's token part (``L0H3``: a head's name and no suffix)."""
    try:
        parse_head(name)
    except QkovError:
        return False
    return True


def term_group(query: str, key: str) -> str:
    """The group of a (query part, key part) term (see the module docstring)."""
    if query == EMBED and _is_head_token_part(key):
        return "k_composition"
    positional = [name == POS_EMBED or name.endswith(POSITION) for name in (query, key)]
    if all(positional) and (query.endswith(POSITION) or key.endswith(POSITION)):
        return "pointer"
    return "other"


def classify(shares: dict[str, float], margin: float) -> str:
    """The mechanism of a head with these group ``shares`` and ``margin`` (module docstring)."""
    if not margin > 0:
        return "other"
    best = max(GROUPS, key=shares.__getitem__)
    return best if shares[best] >= MECHANISM_SHARE else "other"


def induction_mechanisms(
    model: AttnOnlyTransformer,
    tokens: Int[Tensor, "batch pos"],
    period: int,
    heads: list[str] | str,
    described: str = "repeated random tokens",
) -> list[InductionMechanism]:
    """The mechanism of each of ``heads`` (one name is one head) on ``tokens`` (random tokens
    repeating every ``period``), from one frozen run."""
    heads = head_names(heads)
    tokens = model.check_tokens(tokens)
    with torch.no_grad():
        frozen = freeze(model, tokens)
        return [_mechanism(model, tokens, period, head, frozen, described) for head in heads]


def _mechanism(
    model: AttnOnlyTransformer, tokens: Tensor, period: int, head: str, frozen: Frozen, described: str
) -> InductionMechanism:
    target = induction_target_shares(score_parts(model, tokens, head, frozen), period)
    names, shares = target.names, target.shares.cpu().tolist()
    grouped = dict.fromkeys(GROUPS, 0.0)
    writers: dict[str, float] = {}
    terms = [
        TermShare(q, k, finite(share))
        for q, row in zip(names, shares, strict=True)
        for k, share in zip(names, row, strict=True)
    ]
    for term in terms:
        group = term_group(term.query, term.key)
        grouped[group] += term.share or 0.0
        if group == "k_composition":
            writers[term.key] = term.share or 0.0
    top = sorted(terms, key=lambda term: -abs(term.share or 0.0))[:TOP_TERMS]
    defined = math.isfinite(target.margin) and target.margin != 0
    return InductionMechanism(
        head=head,
        mechanism=classify(grouped, target.margin),
        shares={group: share if defined else None for group, share in grouped.items()},
        margin=target.margin,
        writer=max(writers, key=writers.__getitem__) if writers else None,
        top_terms=top,
        tokens=described,
        period=period,
    )


def induction_mechanism_flop(cfg: Config, length: int, heads: int) -> float:
    """FLOP per token of :func:`induction_mechanisms` for ``heads`` heads (counted at the last
    layer, the most parts) on sequences of ``length``: the run that freezes the model, then per head
    every earlier layer's heads on each of at most four origin streams, each part's query and key,
    and the parts' pairwise margins."""
    width = cfg.n_heads * cfg.d_head
    layers = cfg.n_layers - 1
    parts = 3 + layers * (4 * cfg.n_heads + 1)
    origins = 4 * layers * 2 * (2 * cfg.d_model * width + length * width)
    per_head = origins + parts * 4 * cfg.d_model * cfg.d_head + parts**2 * 2 * cfg.d_head
    return forward_flop(cfg, length) + heads * per_head
