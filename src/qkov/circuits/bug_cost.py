"""What a one-layer model's skip-trigram bugs cost, in nats (section "One-Layer Attention-Only
Transformers", "Skip-Trigram 'Bugs'", which asks how much loss they cost and leaves it open).

A head stores its skip-trigrams factored through the source: ``f(a, b, c) = qk(b, a) ov(a, c)``,
so two strong ``(a, b1, c1)`` and ``(a, b2, c2)`` force the crossed ``(a, b1, c2)`` and
``(a, b2, c1)`` (:func:`qkov.circuits.skip_trigrams.skip_trigram_bugs`).

*The cost.* Freeze every attention pattern ``A^h`` at its value on held-out text. The one-layer
model's logits are then a sum of per-head, per-source terms (section "Path Expansion of Logits";
paper, column vectors: ``T = Id ⊗ W_U W_E + Σ_h A^h ⊗ W_U W_OV^h W_E``; ours, row vectors: the
logits at destination ``d`` are ``W_E[t_d] W_U + Σ_h Σ_{s <= d} A^h[d, s] M^h[t_s, :]`` plus
position and bias parts, with ``M^h = W_E W_V^h W_O^h W_U`` the head's full OV circuit). The term
of head ``h``, source ``s`` holding ``a`` and destination ``d`` holding ``b'`` raises the logit of
``c'`` by ``A^h[d, s] M^h[a, c']``: that is the head's skip-trigram ``(a, b', c')`` firing. A *bugged
term* is one whose triple is a crossed one the head cannot avoid and the training corpus never
shows (``Crossed.in_corpus is False``: ``a`` never occurs within ``n_ctx`` tokens before ``b'``
followed by ``c'``), so that a skip-trigram table fitted to the corpus would hold nothing there.
The cost is the held-out loss of the model as it is minus its loss with every bugged term
subtracted where it fires (positive: the bugs hurt).

Why this is the paper's "replace the factored skip-trigrams by unfactored ones on the affected
triples": with attention frozen, the head's effect *is* a table over (source, destination, out)
whose entries are attention times ``M^h``. An unfactored table may set any entry independently;
the smallest such change that removes the bugs sets the bugged triples' output entries to
nothing and keeps every other triple, which is exactly subtracting the bugged terms.

"Nothing" is the centred entry: ``M^h[a, c'] - mean_c M^h[a, c]`` is subtracted from the logit of
``c'``, as the bug table's ``ov`` is centred, because a constant added to every logit of a
position moves no probability (and the raw entry depends on how ``W_U`` happens to be shifted);
the centring here is over the whole vocabulary, the softmax's.

What it leaves out:

- which bugs: only the crossed triples :func:`skip_trigram_bugs` finds among each head's strongest
  skip-trigrams (those the report lists: the ``k`` strongest over tokens seen often enough, and
  the strongest crossings among their pairs); bugs among weaker skip-trigrams, and crossings that
  do occur in the corpus but with a different value than the factored form gives, are kept;
- attention: frozen, so the attention the source wins at the destination (the QK half of the bug)
  still goes to it and still carries the source's other outputs; an unfactored table could also
  have moved that attention elsewhere;
- non-additivity: the log-softmax is not linear, so the total, each head's figure and each
  term's figure are each computed jointly on their own terms and do not sum exactly;
- LayerNorm: a normalised model scales every term by per-position scales; it is refused here.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from jaxtyping import Float, Int
from torch import Tensor

from qkov.circuits.budget import forward_flop
from qkov.circuits.paths import term_importance, term_importance_flop
from qkov.circuits.qk_ov import full_ov_circuit
from qkov.circuits.skip_trigrams import BugCost, BugTerm, SkipTrigramBug
from qkov.config import Config
from qkov.errors import QkovError
from qkov.linalg import FactoredMatrix
from qkov.model import AttnOnlyTransformer
from qkov.names import head_name, hook_name, parse_head
from qkov.numbers import finite

TOP_BUGS = 20  # the costliest bugged terms kept in the result
CROSSED_PER_HEAD = 20  # at most: skip_trigram_bugs keeps 10 bugs of two crossed triples each
LOSS_ROWS = 256  # predicted positions whose float64 losses are computed at once


class _Removal(NamedTuple):
    """What removing one term subtracts: ``amount`` from the logit of ``out`` at each flat
    predicted position ``row`` (``batch * (pos - 1)`` of them)."""

    row: Tensor
    out: Tensor
    amount: Tensor


def bugged_triples(bugs: dict[str, list[SkipTrigramBug]]) -> dict[str, list[tuple[int, int, int, float]]]:
    """Each head's distinct crossed triples ``(source, destination, out, strength)`` that never
    occur in the corpus; refuses bugs not checked against one."""
    triples: dict[str, list[tuple[int, int, int, float]]] = {}
    for name, found in bugs.items():
        seen: dict[tuple[int, int, int], float] = {}
        for bug in found:
            for crossed in bug.crossed:
                if crossed.in_corpus is None:
                    raise QkovError("the bug cost needs the skip-trigram bugs checked against a corpus")
                if not crossed.in_corpus:
                    seen.setdefault((bug.source, crossed.destination, crossed.out), crossed.strength)
        triples[name] = [(*triple, strength) for triple, strength in seen.items()]
    return triples


def centred_ov(ov: FactoredMatrix, source: int, out: int) -> float:
    """``M[source, out] - mean_c M[source, c]`` for one head's full OV circuit ``M``, in float64."""
    row = ov.A[source].to(torch.float64) @ ov.B.to(torch.float64)
    return float(row[out] - row.mean())


def _removal(
    pattern: Float[Tensor, "batch dest src"],
    tokens: Int[Tensor, "batch pos"],
    triple: tuple[int, int, int],
    ov: float,
) -> _Removal:
    """Where one head's term ``(source, destination, out)`` fires among the predicted positions,
    and how much it adds there: the attention on the source's occurrences times ``ov``."""
    source, destination, out = triple
    is_source = (tokens == source).to(torch.float64)[:, :, None]
    mass = (pattern[:, :-1].to(torch.float64) @ is_source).squeeze(-1)  # [batch, pos - 1]
    mass = (mass * (tokens[:, :-1] == destination)).flatten()
    row = mass.nonzero().squeeze(1)
    return _Removal(row, torch.full_like(row, out), mass[row] * ov)


class _Losses(NamedTuple):
    """The model's logits ``[batch * pos, d_vocab]`` (in the model's dtype, not copied: each row
    read is widened to float64, which is exact), the row of each predicted position, its target
    and its loss, in float64."""

    logits: Tensor
    index: Tensor
    targets: Tensor
    base: Tensor

    def saving(self, removals: list[_Removal]) -> float:
        """The model's loss minus its loss with every removal subtracted, in nats per predicted
        token: only the rows they touch change."""
        if not removals:
            return 0.0
        row, out, amount = (torch.cat(field) for field in zip(*removals, strict=True))
        rows, where = torch.unique(row, return_inverse=True)
        changed = self.logits[self.index[rows]].to(torch.float64)
        changed = changed.index_put((where, out), -amount, accumulate=True)
        return float((self.base[rows] - _row_loss(changed, self.targets[rows])).sum()) / len(self.targets)


def _row_loss(logits: Float[Tensor, "rows d_vocab"], targets: Int[Tensor, " rows"]) -> Float[Tensor, " rows"]:
    return logits.logsumexp(-1) - logits.gather(1, targets[:, None]).squeeze(1)


def _losses(logits: Float[Tensor, "batch pos d_vocab"], tokens: Int[Tensor, "batch pos"]) -> _Losses:
    """Each predicted position's float64 loss, ``LOSS_ROWS`` rows at a time: bounded memory where a
    float64 copy of every row would double a large vocabulary's logits."""
    batch, pos = tokens.shape
    starts = torch.arange(batch, device=tokens.device)[:, None] * pos
    index = (starts + torch.arange(pos - 1, device=tokens.device)).flatten()
    flat, targets = logits.flatten(0, 1), tokens[:, 1:].flatten()
    base = [
        _row_loss(flat[index[at : at + LOSS_ROWS]].to(torch.float64), targets[at : at + LOSS_ROWS])
        for at in range(0, len(index), LOSS_ROWS)
    ]
    return _Losses(flat, index, targets, torch.cat(base))


def bug_cost_flop(cfg: Config, length: int) -> float:
    """FLOP per token of :func:`bug_cost` on sequences of ``length``: the run that records the
    patterns, the gains (:func:`term_importance_flop`) and each bugged term's attention mass."""
    per_term = 2 * length * CROSSED_PER_HEAD * cfg.n_heads
    return forward_flop(cfg, length) + term_importance_flop(cfg, length) + per_term


def bug_cost(
    model: AttnOnlyTransformer,
    bugs: dict[str, list[SkipTrigramBug]],
    tokens: Int[Tensor, "batch pos"],
    described: str = "the given tokens",
    top: int = TOP_BUGS,
) -> BugCost:
    """What the bugged terms of every head cost on held-out ``tokens`` (see the module docstring):
    ``bugs`` are :class:`SkipTrigrams`' ``bugs`` of this model, checked against its training corpus;
    ``described`` names the tokens in the result, which keeps the ``top`` costliest terms."""
    cfg = model.cfg
    if cfg.n_layers != 1 or cfg.has_layer_norm:
        raise QkovError("the skip-trigram bug cost is defined for one-layer models without LayerNorm")
    tokens = model.check_tokens(tokens)
    if tokens.shape[1] < 2:
        raise QkovError("the bug cost needs sequences of at least 2 tokens (it measures next-token loss)")
    terms, by_head, total = _bugged_terms(model, bugs, tokens)  # its run freed before the gains'
    gains = term_importance(model, tokens, described)
    head_gain = {head_name(0, h): gain for h, gain in enumerate(gains.first_order_by_head[0])}
    return BugCost(
        nats_per_token=total,
        by_head=by_head,
        heads_gain=gains.marginal[0],
        head_gain=head_gain,
        share=_share(total, gains.marginal[0]),
        share_by_head={name: _share(cost, head_gain[name]) for name, cost in by_head.items()},
        terms=len(terms),
        top=sorted(terms, key=lambda t: -t.nats_per_token)[:top],
        tokens=described,
    )


@torch.no_grad()
def _bugged_terms(
    model: AttnOnlyTransformer, bugs: dict[str, list[SkipTrigramBug]], tokens: Int[Tensor, "batch pos"]
) -> tuple[list[BugTerm], dict[str, float], float]:
    """Every bugged term with what removing it alone saves, each head's saving and the total."""
    cfg = model.cfg
    logits, cache = model.run_with_cache(tokens, names_filter=hook_name(0, "pattern"))
    pattern, losses = cache[hook_name(0, "pattern")], _losses(logits, tokens)
    ov = full_ov_circuit(model)[0]
    terms, removals = [], {}
    for name, triples in bugged_triples(bugs).items():
        head = parse_head(name, cfg)[1]
        removals[name] = []
        for source, destination, out, strength in triples:
            entry = centred_ov(ov[head], source, out)
            removal = _removal(pattern[:, head], tokens, (source, destination, out), entry)
            removals[name].append(removal)
            saving = losses.saving([removal])
            terms.append(BugTerm(name, source, destination, out, strength, entry, len(removal.row), saving))
    by_head = {name: losses.saving(found) for name, found in removals.items()}
    return terms, by_head, losses.saving([r for found in removals.values() for r in found])


def _share(cost: float, gain: float) -> float | None:
    return finite(cost / gain) if gain else None
