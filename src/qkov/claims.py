"""The paper's claims, each checked by one small function: measurements in, a :class:`Claim` out.

Every claim answers one of three words (:mod:`qkov.numbers`): "holds" when its figure clears the
rule's threshold by more than its error, "does not hold" when it misses by more than its error, and
"undetermined" in between. The figure, its standard error or interval, and the threshold are kept
in the claim beside the rule's text. Every threshold is named once here (or, for the head roles, in
:mod:`qkov.circuits.heads`, and for the phase change in :mod:`qkov.circuits.phase_change`, beside its
sources) and written into the claim's ``rule``, which the report and the README show; a claim's
verdict comes only from its rule, never by hand. docs/claims.md states every rule.
"""

from __future__ import annotations

import keyword
import math
from dataclasses import replace

from qkov.circuits.copying import DIAGONAL_Z_THRESHOLD
from qkov.circuits.heads import INDUCTION_HEAD, PREVIOUS_TOKEN_HEAD
from qkov.circuits.phase_change import CONTROL_SHARE, MAX_WINDOW_DECADES, MOST_OF_CHANGE, describe
from qkov.circuits.skip_trigrams import SkipTrigram
from qkov.numbers import (
    FAILS,
    HOLDS,
    UNDETERMINED,
    VERDICTS,
    all_of,
    decide,
    weighted_ratio_se,
    z_interval,
)
from qkov.results import Claim, Results

BIGRAM_CORRELATION = 0.5  # log P(next | current): the direct path against the corpus
K_COMPOSITION_POSITIVITY = 0.5  # eigenvalue positivity of the induction head's K-composition term
REPEAT_LOSS_DROP = 1.0  # nats, first repeat to second
K_DOMINANCE = 1.5  # the strongest K pair over the strongest Q and V pairs (baseline subtracted)
SECOND_ORDER_SHARE = 0.25  # second-order loss reduction, as a fraction of the first-order one
PYTHON_ENRICHMENT = 2.0  # Python skip-trigrams, as a multiple of their share among random triples
COPYING_QUANTILE_RANKS = (195, 200)  # of 200 random scores: the 99th percentile's 95% range
PYTHON_WORDS = {"self", "cls", "__init__", "print", "len", "range", "isinstance"}  # besides keywords
QUICK_NOTE = "--quick: the models are too small to decide (no phenomenon is promised at that size)"


def bigram_claim(zero: Results) -> Claim:
    b = zero.bigram
    assert b is not None, "the 0-layer model is analysed with its corpus"
    r, n = b.correlation, b.pairs_compared
    if r is None or n < 4:
        verdict, error, interval = UNDETERMINED, None, None
    else:  # Fisher's z: atanh(r) is near normal with standard error 1 / sqrt(n - 3)
        z_error = 1 / math.sqrt(n - 3)
        verdict = decide(math.atanh(r) - math.atanh(BIGRAM_CORRELATION), z_error)
        error = (1 - r * r) * z_error
        interval = (math.tanh(math.atanh(r) - 1.96 * z_error), math.tanh(math.atanh(r) + 1.96 * z_error))
    shown = "undefined" if r is None else f"{r:.3f}"
    ci = "" if interval is None else f" (95% {interval[0]:.3f} to {interval[1]:.3f})"
    return Claim(
        "The zero-layer model approximates bigram statistics",
        "A zero-layer transformer can only model bigrams; W_U W_E approximates the bigram log-likelihood.",
        f"correlation of log P(next | current) with the corpus {shown}{ci} over {n} pairs; KL {b.kl:.2f} "
        f"nats against a bigram entropy of {b.corpus_entropy:.2f}",
        f"the correlation is above {BIGRAM_CORRELATION}",
        verdict,
        figure=r,
        error=error,
        interval=interval,
        threshold=BIGRAM_CORRELATION,
        note="error: Fisher's z over the pairs compared, as if independent",
    )


def _direct(one: Results) -> str:
    """The direct copying measures of the same heads, beside the eigenvalue statistic."""
    direct = one.copying_direct or []
    if not direct:
        return "direct measures: not computed"
    diagonal = sum(d.diagonal_z > DIAGONAL_Z_THRESHOLD for d in direct)
    top1 = sum(d.self_top1 > 0.5 for d in direct)
    return (
        f"direct measures (not the paper's): {diagonal} of {len(direct)} heads raise their own token's logit "
        f"more than {DIAGONAL_Z_THRESHOLD:g} row standard deviations (diagonal z), {top1} of {len(direct)} "
        "make it the row's top logit for most tokens (self-top-1)"
    )


def copying_claim(one: Results) -> Claim:
    """By the eigenvalue statistic, as the paper counted its heads; the direct measures are shown
    beside it. The count's range is the heads above the highest and above the lowest plausible 99th
    percentile of the random baseline (order statistics ``COPYING_QUANTILE_RANKS`` of 200 scores)."""
    c = one.copying
    assert c is not None
    n, ordered = len(c.heads), sorted(c.baseline)
    low_rank, high_rank = (round(k * len(ordered) / 200) for k in COPYING_QUANTILE_RANKS)
    strict, loose = ordered[max(0, high_rank - 1)], ordered[max(0, low_rank - 1)]
    above = [h.copying_score for h in c.heads if h.copying_score is not None]
    least, most = sum(s > strict for s in above), sum(s > loose for s in above)
    verdict = HOLDS if least > n / 2 else FAILS if most <= n / 2 else UNDETERMINED
    scores = ", ".join("undefined" if h.copying_score is None else f"{h.copying_score:+.2f}" for h in c.heads)
    return Claim(
        "Most one-layer heads copy",
        "10 of 12 heads have OV circuits with mostly positive eigenvalues (the paper's statistic).",
        f"eigenvalue statistic (the paper's): {c.copying_heads} of {n} heads above the random "
        f"baseline's 99th percentile ({c.threshold:+.2f}; {least}-{most} at the ends of its range "
        f"{loose:+.2f} to {strict:+.2f}); scores {scores}; " + _direct(one),
        "more than half the heads score above the random baseline's 99th percentile by the eigenvalue "
        "statistic",
        verdict,
        figure=float(c.copying_heads),
        interval=(float(least), float(most)),
        threshold=n / 2,
        note="a count of heads: its range is the baseline percentile's own uncertainty",
    )


def _pythonness(t: SkipTrigram, strings: list[str]) -> int:
    """How many of the skip-trigram's three tokens are Python keywords or common Python names."""
    words = (strings[t.source].strip(), strings[t.destination].strip(), strings[t.out].strip())
    return sum(_is_python(w) for w in words)


def _is_python(word: str) -> bool:
    return keyword.iskeyword(word.strip()) or word.strip() in PYTHON_WORDS


def python_skip_trigram_claim(one: Results) -> Claim:
    """Python skip-trigrams against chance: the share of the strongest skip-trigrams with a Python
    word, against the share of random vocabulary triples with one (``1 - (1 - p)^3``, ``p`` the
    vocabulary's share of Python words). The margin's error is binomial over the skip-trigrams."""
    assert one.skip_trigrams is not None
    s = one.tokens
    every = [t for rows in one.skip_trigrams.tables.values() for t in rows]
    python = [t for t in every if _pythonness(t, s) > 0]
    chance = 1 - (1 - sum(map(_is_python, s)) / max(1, len(s))) ** 3
    share = len(python) / max(1, len(every))
    laplace = (len(python) + 1) / (len(every) + 2)
    error = math.sqrt(laplace * (1 - laplace) / max(1, len(every)))
    margin = share - PYTHON_ENRICHMENT * chance
    verdict = FAILS if not python else decide(margin, error)
    # examples: the most Python-like first, then those that do not copy the source, then the strongest
    python.sort(key=lambda t: (-_pythonness(t, s), t.out == t.source, -t.strength))
    examples = "; ".join(f"{s[t.source]!r} … {s[t.destination]!r} → {s[t.out]!r}" for t in python[:4])
    return Claim(
        "One-layer heads implement skip-trigrams, including Python patterns",
        "Skip-trigrams such as 'def … ( → self' and 'import … . → ...' in a model trained with code.",
        f"{len(python)} of the {len(every)} strongest skip-trigrams ({share:.1%} ± {error:.1%}) involve a "
        f"Python keyword or name, against {chance:.1%} of random vocabulary triples; "
        f"e.g. {examples or 'none'}",
        f"the share of the strongest skip-trigrams with a Python keyword or name is more than "
        f"{PYTHON_ENRICHMENT:g}x the share among random triples of the vocabulary",
        verdict,
        figure=share,
        error=error,
        interval=z_interval(share, error),
        threshold=PYTHON_ENRICHMENT * chance,
        note="error: binomial over the skip-trigrams",
    )


def skip_trigram_bug_claim(one: Results) -> Claim:
    assert one.skip_trigrams is not None
    crossed = [c for bugs in one.skip_trigrams.bugs.values() for bug in bugs for c in bug.crossed]
    checked = [c for c in crossed if c.in_corpus is not None]
    never = [c for c in checked if c.in_corpus is False]
    verdict = UNDETERMINED if not checked else HOLDS if never else FAILS
    return Claim(
        "Skip-trigram 'bugs' exist",
        "Strong (a, b1, c1) and (a, b2, c2) force (a, b1, c2) and (a, b2, c1): 'keep … in bay'.",
        f"{len(crossed)} forced crossings among each head's strongest skip-trigrams, {len(checked)} checked "
        f"against the corpus, {len(never)} of which never occur in it",
        "at least one forced crossing never occurs in the corpus",
        verdict,
        figure=float(len(never)),
        threshold=1.0,
        note="a count, over the crossings among each head's strongest skip-trigrams only"
        + ("" if checked else "; no corpus to check the crossings against"),
    )


def induction_claim(two: Results) -> Claim:
    t, checks = two.repeated_tokens, {row.head: row for row in two.induction_check or []}
    assert t is not None
    prev = max((h for h in t.heads if h.layer == 0), key=lambda h: h.previous_token_score or 0.0)
    induction = [h for h in t.heads if h.name in t.induction_heads and h.layer >= 1]
    composing = [
        h
        for h in induction
        if checks[h.name].writer == prev.name
        and checks[h.name].k_composition_positivity > K_COMPOSITION_POSITIVITY
    ]
    copying = {h.name: h.copying_score for h in two.copying.heads} if two.copying else {}
    described = ", ".join(
        f"{h.name} (induction {h.induction_score:.2f}, K-composition positivity with {checks[h.name].writer} "
        f"{checks[h.name].k_composition_positivity:+.2f}, OV copying {copying.get(h.name) or 0.0:+.2f})"
        for h in induction
    )
    prev_score, prev_error = prev.previous_token_score or 0.0, prev.previous_token_score_se
    verdict = all_of(decide(prev_score - PREVIOUS_TOKEN_HEAD, prev_error), HOLDS if composing else FAILS)
    return Claim(
        "Two layers: a previous-token head in layer 0, and induction heads in layer 1 that K-compose with it",
        "Induction heads use K-composition with a previous-token head to attend to the token after an "
        "earlier copy of the current one.",
        f"{prev.name}: previous-token score {prev_score:.2f}; induction heads (score above "
        f"{INDUCTION_HEAD}): {described or 'none'} (on {t.sequences} repeated random sequences)"
        + ("" if prev_error is None else f"; previous-token score's standard error {prev_error:.3f}"),
        f"the best layer-0 previous-token score is above {PREVIOUS_TOKEN_HEAD}, and an induction head's "
        f"strongest K-composition is with that head, positivity above {K_COMPOSITION_POSITIVITY}",
        verdict,
        figure=prev_score,
        error=prev_error,
        interval=z_interval(prev_score, prev_error),
        threshold=PREVIOUS_TOKEN_HEAD,
        note="figure: the best previous-token score; error over the sequences; the K-composition "
        "positivity is read without an error",
    )


def repeat_loss_claim(one: Results, two: Results) -> Claim:
    assert one.repeated_tokens is not None and two.repeated_tokens is not None
    repeats = two.repeated_tokens.loss_per_repeat
    one_layer = " / ".join(f"{x:.2f}" for x in one.repeated_tokens.loss_per_repeat)
    drop = repeats[0] - repeats[1]
    return Claim(
        "Loss on repeated random tokens drops after the first repeat",
        "Induction heads let a two-layer model predict the repeat of a random sequence; a one-layer model "
        "cannot.",
        "2-layer: " + " / ".join(f"{x:.2f}" for x in repeats) + f" nats per repeat (drop {drop:.2f}); "
        f"1-layer: {one_layer}",
        f"the 2-layer loss falls by more than {REPEAT_LOSS_DROP} nat from the first repeat to the second",
        decide(drop - REPEAT_LOSS_DROP, two.repeated_tokens.repeat_drop_se),
        figure=drop,
        error=two.repeated_tokens.repeat_drop_se,
        interval=z_interval(drop, two.repeated_tokens.repeat_drop_se),
        threshold=REPEAT_LOSS_DROP,
        note="error: over the sequences",
    )


def phase_change_claim(two: Results) -> Claim:
    """The 2-layer run's window and signatures, against the 1-layer run's control: the 2-layer
    results' ``phase_change``, which :func:`qkov.reproduce.reproduce` computes with the 1-layer
    training log as the control (:func:`~qkov.circuits.phase_change.phase_change`)."""
    change = two.phase_change
    if change is None:
        measured, verdict, figure, error = (
            "no rise in the best induction score during training",
            FAILS,
            None,
            None,
        )
    else:
        measured, verdict = describe(change), change.verdict
        c = change.control
        figure, error = (c.margin, c.margin_error) if c is not None else (None, None)
    return Claim(
        "Induction heads form in a phase change during training",
        "In-context learning and induction heads appear together in one narrow window of training, visible "
        "as a bump in the training loss; a one-layer model has no such window (Olsson et al. 2022).",
        measured,
        f"the best induction score's 10%-90% rise spans at most {MAX_WINDOW_DECADES} decades of training "
        f"tokens, the in-context-learning score makes at least {MOST_OF_CHANGE:.0%} of its gain inside "
        "that window, the training loss falls more steeply (per decade of tokens) somewhere inside it than "
        f"at both ends, and over the same window the 1-layer model gains less than {CONTROL_SHARE:.0%} of "
        "the 2-layer model's in-context-learning gain; each test against the score's noise",
        verdict,
        figure=figure,
        error=error,
        interval=z_interval(figure, error) if figure is not None else None,
        threshold=0.0 if figure is not None else None,
        note=""
        if figure is None
        else "figure: the control test's margin (nats); error from the logged series' scatter",
    )


def k_composition_claim(two: Results) -> Claim:
    """K against Q and V: every score is a distance from the random baseline, in the random scores'
    standard deviations (``baseline_sd``), which is also the margin's error."""
    c, t = two.composition, two.repeated_tokens
    assert c is not None and t is not None
    best = {kind: max(pairs, key=lambda p: p.score) for kind, pairs in (("Q", c.Q), ("K", c.K), ("V", c.V))}
    k, others = best["K"], max(best["Q"].score, best["V"].score)
    prev = max((h for h in t.heads if h.layer == 0), key=lambda h: h.previous_token_score or 0.0)
    sd = c.baseline_sd
    sds = (lambda p: f", {p.score / sd:+.1f} random SDs") if sd else (lambda p: "")
    measured = "; ".join(
        f"strongest {kind}: {p.writer} → {p.reader} {p.score:+.3f}{sds(p)}" for kind, p in best.items()
    )
    margin = k.score - K_DOMINANCE * max(others, 0.0)
    error = None if sd is None else sd * math.hypot(1, K_DOMINANCE)
    pair = k.writer == prev.name and k.reader in t.induction_heads
    return Claim(
        "Only K-composition with the previous-token head stands out",
        "In the composition diagram, K-composition from the previous-token head into the induction heads "
        "dominates. The corrected paper says a bug in its low-rank library hid composition: the corrected "
        "diagram shows more Q- and V-composition than the first one did.",
        measured + f" (baseline {c.baseline:.3f} subtracted" + (f", random SD {sd:.4f})" if sd else ")"),
        "the strongest K pair runs from the previous-token head to an induction head and beats every Q and "
        f"V pair by {K_DOMINANCE}x",
        all_of(HOLDS if pair else FAILS, decide(margin, error)),
        figure=margin,
        error=error,
        interval=z_interval(margin, error),
        threshold=0.0,
        note=f"figure: K minus {K_DOMINANCE}x the strongest Q or V; error: the random scores' SD",
    )


def virtual_head_claim(two: Results) -> Claim:
    """The share ``|second order| / first order`` of the loss reductions, its standard error over
    the sequences term importance scored (the delta method on the ratio of their token-weighted
    means, :func:`~qkov.numbers.weighted_ratio_se`)."""
    t = two.term_importance
    assert t is not None
    first, second = t.marginal[0], t.marginal[1]
    share = abs(second) / first if first > 0 else math.inf
    error = None
    if math.isfinite(share) and len(t.scored_by_sequence) >= 2:
        zero, one, two_ = t.loss_by_order_by_sequence[:3]
        first_rows = [a - b for a, b in zip(zero, one, strict=True)]
        second_rows = [a - b for a, b in zip(one, two_, strict=True)]
        error = weighted_ratio_se(second_rows, first_rows, t.scored_by_sequence)
    shown = f"{share:.1%}" + (f" ± {error:.1%}" if error is not None else "")
    return Claim(
        "Second-order (virtual head) terms matter little",
        "Term importance: most of the loss reduction comes from the direct path and first-order terms.",
        f"on {t.tokens}: loss {' → '.join(f'{x:.3f}' for x in t.loss_by_order)} for paths up to order 0, 1, "
        f"2; first order reduces it by {first:.3f} nats, second order by {second:.3f} ({shown})",
        f"the second order's loss reduction is below {SECOND_ORDER_SHARE:.0%} of the first order's",
        decide(SECOND_ORDER_SHARE - share, error) if math.isfinite(share) else FAILS,
        figure=share if math.isfinite(share) else None,
        error=error,
        interval=z_interval(share, error) if math.isfinite(share) else None,
        threshold=SECOND_ORDER_SHARE,
        note=(
            f"error: over the {len(t.scored_by_sequence)} sequences scored, as independent units"
            if error is not None
            else "error not measured: fewer than two sequences scored"
        ),
    )


def for_quick_models(claim: Claim) -> Claim:
    """A ``--quick`` run's claim: its tiny models cannot show the effects, so a rule they fail is
    undetermined there, and says why."""
    if claim.verdict != FAILS:
        return claim
    return replace(
        claim, verdict=UNDETERMINED, note=f"{QUICK_NOTE}; {claim.note}" if claim.note else QUICK_NOTE
    )


def evaluate_claims(models: dict[str, Results], quick: bool = False) -> list[Claim]:
    """Every claim, from the 0-, 1- and 2-layer models' results (``quick``: the tiny models of
    ``qkov reproduce --quick``, :func:`for_quick_models`)."""
    zero, one, two = models["0-layer"], models["1-layer"], models["2-layer"]
    claims = [
        bigram_claim(zero),
        copying_claim(one),
        python_skip_trigram_claim(one),
        skip_trigram_bug_claim(one),
        induction_claim(two),
        repeat_loss_claim(one, two),
        phase_change_claim(two),
        k_composition_claim(two),
        virtual_head_claim(two),
    ]
    return [for_quick_models(c) for c in claims] if quick else claims


def figure_text(claim: Claim) -> str:
    """The figure the rule reads with its error or range, for a table cell."""
    if claim.figure is None:
        return "—"
    if claim.error is not None:
        return f"{claim.figure:.3g} ± {claim.error:.2g}"
    if claim.interval is not None:
        return f"{claim.figure:.3g} ({claim.interval[0]:.3g}-{claim.interval[1]:.3g})"
    return f"{claim.figure:.3g}"


def tally(claims: list[Claim]) -> str:
    """``"7 hold, 1 do not hold, 1 undetermined"``: every verdict's count."""
    counts = {v: sum(c.verdict == v for c in claims) for v in VERDICTS}
    return f"{counts[HOLDS]} hold, {counts[FAILS]} do not hold, {counts[UNDETERMINED]} {UNDETERMINED}"


def summary_table(claims: list[Claim]) -> str:
    width = max(len(c.claim) for c in claims)
    figures = [figure_text(c) for c in claims]
    fw = max(len("figure"), *(len(f) for f in figures))
    lines = [f"{'claim':<{width}}  {'figure':<{fw}}  verdict"]
    lines += [f"{c.claim:<{width}}  {f:<{fw}}  {c.verdict}" for c, f in zip(claims, figures, strict=True)]
    notes = sorted({c.note for c in claims if c.verdict == UNDETERMINED and QUICK_NOTE in c.note})
    return "\n".join(lines + [f"Claims: {tally(claims)}"] + ([QUICK_NOTE] if notes else []))
