"""One report section per analysis, each rendering its typed result (:mod:`qkov.results`) and
nothing else: no thresholds, no computation beyond formatting. Captions are written from the data
they describe. :data:`SECTIONS` lists them in page order, keyed by the ``Results`` field they show.
"""

from __future__ import annotations

from collections.abc import Callable

from qkov.circuits.ablation import MEANINGS
from qkov.circuits.heads import AttentionExample
from qkov.circuits.neurons import LayerNeurons
from qkov.circuits.phase_change import MIN_SLOPE_SPACING, PhaseChange
from qkov.circuits.skip_trigrams import BugCost, SkipTrigram, SkipTrigramBug
from qkov.names import head_name, parse_head
from qkov.report.markup import Raw, figure, json_for_script, shown, table, tok
from qkov.report.svg import (
    attention_grid,
    attention_scale,
    bars,
    circuit_diagram,
    esc,
    heatmap,
    line_chart,
    scatter,
    shared_limit,
    training_heatmap,
)
from qkov.results import Claim, Results
from qkov.training_log import TrainingPoint

BLUE, RED = "#1f77b4", "#d62728"
GREEN, PURPLE = "#2ca02c", "#9467bd"  # eigenvalues: positive and negative real part


def claims_section(claims: list[Claim]) -> str:
    rows = [
        [claim.claim, claim.paper, claim.measured, claim.rule, "yes" if claim.holds else "no"]
        for claim in claims
    ]
    classes = ["holds" if claim.holds else "fails" for claim in claims]
    held = sum(claim.holds for claim in claims)
    return (
        f'<section id="claims"><h2>Claims: {held} of {len(claims)} hold</h2>'
        + table(["claim", "paper", "measured here", "holds when", "holds"], rows, classes)
        + "</section>"
    )


SOURCES = {
    "qkov": "trained by qkov",
    "huggingface": "imported from Hugging Face",
    "transformer_lens": "imported from TransformerLens",
}
NORMALIZATIONS = {
    "none": "no LayerNorm",
    "LN": "LayerNorm (not folded)",
    "LNPre": "LayerNorm folded into the weights",
}


def model_header(r: Results) -> str:
    """Where the model came from, its settings, and (for GPT-2-style models) what is exact."""
    cfg = r.config
    settings = ", ".join(f"{k} {v}" for k, v in cfg.to_dict().items())
    mlp = f"MLPs of {cfg.d_mlp} ({cfg.act_fn})" if cfg.d_mlp else "attention-only"
    source, norm = SOURCES.get(cfg.source, cfg.source), NORMALIZATIONS[cfg.normalization]
    head = f"<p><b>{esc(source)}</b>; {esc(norm)}; {esc(mlp)}.</p>"
    caveats = []
    if cfg.normalization != "none":
        caveats.append(
            "The weight-based analyses (copying, spectra, composition, skip-trigrams, the K-composition "
            "check) read the LayerNorm-folded weights: exact up to each position's positive LayerNorm scale."
        )
    if cfg.d_mlp:
        caveats.append(
            "With MLPs they cover the direct path through each head only (no MLP, MLP0 included); path "
            "expansion and term importance stay exact, each MLP's write a frozen term; head scores, "
            "ablations and losses come from the model's own run."
        )
    return (
        head
        + "".join(f"<p class='small'>{esc(caveat)}</p>" for caveat in caveats)
        + f"<p class='small'>{esc(settings)}</p>"
    )


def _window(change: PhaseChange | None) -> list[tuple[float, float, str]]:
    """The phase-change window as a shaded band, when there is one."""
    if change is None:
        return []
    title = f"window: the best induction score's 10%-90% rise, {change.window_decades:.2f} decades"
    return [(change.window_start_tokens, change.window_end_tokens, title)]


def _note(band: list) -> str:
    """What the shading means, or that there is none."""
    if band:
        return "Log axis of training tokens; shaded: the phase-change window (10%-90% of the induction rise)."
    return "Log axis of training tokens; no phase-change window (no rise in the best induction score)."


def _loss_figure(log: list[TrainingPoint], band: list) -> str:
    loss = {
        "train loss": [(row.tokens, row.train_loss) for row in log],
        "eval loss": [(row.tokens, row.eval_loss) for row in log],
    }
    chart = line_chart(loss, "tokens seen", "loss (nats)", label="training loss", log_x=True, bands=band)
    return figure(chart, "Training and eval loss. " + _note(band)) if chart else ""


def _bump_figure(change: PhaseChange | None, band: list) -> str:
    if change is None or not change.loss_slope:
        return ""
    loss = "training" if change.slope_of == "train_loss" else "held-out"
    slope = {f"d {loss} loss / d log10 tokens": change.loss_slope}
    chart = line_chart(slope, "tokens seen", "nats per decade", label="loss slope", log_x=True, bands=band)
    bump = "does" if "loss_bump" in change.signatures else "does not"
    return figure(
        chart,
        f"The {loss} loss's slope per decade of tokens between evaluations at least "
        f"{MIN_SLOPE_SPACING} decades apart (3-point running mean). It {bump} dip inside the window below "
        "its values at both ends. " + _note(band),
        "the phase change is visible as a bump in the training loss.",
    )


def _scores_figure(log: list[TrainingPoint], band: list) -> str:
    if all(row.induction_score is None for row in log):
        return ""  # a 0-layer model, or a log without head scores
    scores = {
        "best induction score": [(row.tokens, row.induction_score) for row in log],
        "best previous-token score": [(row.tokens, row.previous_token_score) for row in log],
    }
    behaviour = {
        "loss on 2nd repeat": [(row.tokens, row.repeat_loss_second) for row in log],
        "loss on 1st repeat": [(row.tokens, row.repeat_loss_first) for row in log],
    }
    charts = line_chart(
        scores, "tokens seen", "attention score", label="head scores during training", log_x=True, bands=band
    ) + line_chart(
        behaviour,
        "tokens seen",
        "loss (nats)",
        label="in-context loss during training",
        log_x=True,
        bands=band,
    )
    return figure(
        charts,
        "The best induction and previous-token scores, and the loss on repeated random tokens, during "
        "training. " + _note(band),
        "induction heads form in a sudden phase change, visible as a drop in the loss on repeated tokens.",
    )


def _per_token_figure(log: list[TrainingPoint], change: PhaseChange | None) -> str:
    rows = sorted((row for row in log if row.loss_by_position and row.tokens > 0), key=lambda row: row.tokens)
    rows = [row for row in rows if len(row.loss_by_position) == len(rows[-1].loss_by_position)]
    if len(rows) < 2:
        return ""
    marks = [(change.window_start_tokens, "10%"), (change.window_end_tokens, "90%")] if change else []
    columns = [row.loss_by_position for row in rows]
    chart, limit = training_heatmap(
        [row.tokens for row in rows], columns, "tokens seen", "token index", marks, "per-token loss"
    )
    return figure(
        chart,
        "Held-out loss at each token index minus the evaluation's mean loss, over training (red: higher, "
        f"blue: lower, saturating at ±{limit:.2f} nats)"
        + ("; dashed: the phase-change window." if marks else "."),
        "before the phase change, loss stops improving around the 50th token; after it, loss keeps "
        "improving later in the context.",
    )


def training_section(r: Results) -> str:
    log = r.training
    if not log:
        return ""
    band = _window(r.phase_change)
    parts = [
        _loss_figure(log, band),
        _bump_figure(r.phase_change, band),
        _scores_figure(log, band),
        _per_token_figure(log, r.phase_change),
    ]
    return "<h3>Training</h3>" + "".join(parts)


def _phase_change_summary(name: str, change: PhaseChange) -> str:
    icl = "not logged" if change.icl_change is None else f"{change.icl_change:.0%} of its change inside"
    control = change.control
    if control is None:
        against = "no 1-layer control in these results (one checkpoint alone)"
    elif control.narrowest_decades is None:
        against = "1-layer control: its in-context-learning score never moved or was not logged"
    else:
        found = "a window too" if control.found else "no window"
        against = (
            f"1-layer control: {found} (narrowest half-change window {control.narrowest_decades:.2f} decades)"
        )
    verdicts = {
        True: "the phase change holds",
        False: "the phase change does not hold",
        None: "undecided: every signature is inside the window, but the rule also needs a 1-layer control "
        "run's log (qkov reproduce trains one)",
    }
    return (
        f"<p>{esc(name)}: window {change.window_start_tokens:,.0f}-{change.window_end_tokens:,.0f} tokens "
        f"({change.window_decades:.2f} decades); in-context-learning score {esc(icl)}; signatures inside: "
        f"{esc(', '.join(change.signatures) or 'none')}; {esc(against)}. Verdict: "
        f"<b>{esc(verdicts[change.holds])}</b>.</p>"
    )


def phase_change_section(models: dict[str, Results]) -> str:
    """Every model's in-context-learning score on one log axis (the paper's comparison of one layer
    with two), shaded by the window of the deepest model that has one."""
    series = {
        name: [(row.tokens, row.icl_score) for row in r.training]
        for name, r in models.items()
        if any(row.icl_score is not None for row in r.training)
    }
    if not series:
        return ""
    changes = [(r.config.n_layers, name, r.phase_change) for name, r in models.items() if r.phase_change]
    deepest = max(changes, key=lambda c: c[0]) if changes else None
    band = _window(deepest[2]) if deepest else []
    chart = line_chart(series, "tokens seen", "loss difference (nats)", label="in-context learning score",
                       log_x=True, bands=band)  # fmt: skip
    caption = (
        "In-context-learning score during training: held-out loss at a late token index minus at an early "
        "one (the paper's 500th minus 50th of 1024, scaled to the context); lower is more in-context "
        "learning. " + _note(band)
    )
    claim = "in-context learning improves abruptly in the phase change, in models of two or more layers only."
    summary = _phase_change_summary(deepest[1], deepest[2]) if deepest else ""
    return (
        '<section id="phase-change"><h2>Phase change</h2>'
        + summary
        + figure(chart, caption, claim)
        + "</section>"
    )


def bigram_section(r: Results) -> str:
    bigram = r.bigram
    if bigram is None:
        return ""
    strings = r.tokens

    def top(pairs: list[tuple[int, float]]) -> Raw:
        return Raw(" ".join(f"{tok(strings[token])}&nbsp;{p:.2f}" for token, p in pairs))

    rows = [[tok(strings[e.token]), e.count, top(e.corpus), top(e.model)] for e in bigram.examples]
    correlation = "undefined" if bigram.correlation is None else f"{bigram.correlation:.3f}"
    return (
        "<h3>Direct path as a bigram table</h3>"
        f"<p>Over the {bigram.tokens_compared} most common tokens: correlation of log P(next | current) "
        f"between the direct path W<sub>E</sub>W<sub>U</sub> and the corpus {correlation} "
        f"({bigram.pairs_compared} pairs); KL(corpus || model) {bigram.kl:.3f} nats against a corpus "
        f"conditional entropy of {bigram.corpus_entropy:.3f}.</p>"
        + table(["token", "count", "corpus: top next tokens", "direct path: top next tokens"], rows)
    )


def heads_section(r: Results) -> str:
    """Every head's scores side by side, from the copying, direct copying and repeated-token results."""
    if r.copying is None or r.copying_direct is None or r.repeated_tokens is None:
        return ""
    header = ["head", "OV copying (eigenvalues)", "self is top logit", "diagonal z"]
    header += ["previous-token", "induction", "duplicate-token"]
    heads = zip(r.copying.heads, r.copying_direct, r.repeated_tokens.heads, strict=True)
    rows = [
        [copying.name, copying.copying_score, direct.self_top1, direct.diagonal_z]
        + [behaviour.previous_token_score, behaviour.induction_score, behaviour.duplicate_token_score]
        for copying, direct, behaviour in heads
    ]
    repeated = r.repeated_tokens
    losses = " / ".join(f"{x:.2f}" for x in repeated.loss_per_repeat)
    return (
        "<h3>Heads</h3>"
        + table(header, rows)
        + f"<p>Loss on {repeated.sequences} sequences of {repeated.period} random tokens repeated "
        f"{repeated.repeats} times, per repeat: {losses} nats.</p>"
    )


def _eigenvalue_plot(name: str, score: float | None, eigenvalues: list[tuple[float, float]]) -> str:
    limit = max((abs(complex(re, im)) for re, im in eigenvalues), default=1.0) or 1.0
    points = [
        {"x": re, "y": im, "label": f"{re:+.3g}{im:+.3g}i", "colour": GREEN if re >= 0 else PURPLE}
        for re, im in eigenvalues
    ]
    plot = scatter(
        points, "Re λ", "Im λ", (-limit, limit), (-limit, limit), f"eigenvalues of {name}", 220, 200, 2.5
    )
    score_text = "undefined" if score is None else f"{score:+.2f}"
    return f"<div><div class='small'>{esc(name)}: score {score_text}</div>{plot}</div>"


def copying_section(r: Results) -> str:
    copying = r.copying
    if copying is None:
        return ""
    plots = "".join(_eigenvalue_plot(h.name, h.copying_score, h.eigenvalues) for h in copying.heads)
    points = [{"x": x, "y": 0.0, "label": f"random: {x:+.3f}", "colour": "#999999"} for x in copying.baseline]
    for i, h in enumerate(h for h in copying.heads if h.copying_score is not None):
        colour = RED if h.copies else BLUE
        label = f"{h.name}: {h.copying_score:+.3f}"  # staggered rows keep close scores readable
        points.append(
            {"x": h.copying_score, "y": 0.8 + 0.2 * (i % 3), "label": label, "text": h.name, "colour": colour}
        )
    x_label = "copying score (0: random, 1: heads; red: above the 99th percentile)"
    against = scatter(
        points, x_label, "", (-1, 1), (-0.5, 1.5), "copying scores against the random baseline", 700, 180,
        marks=[(copying.threshold, "99th percentile of random")],
    )  # fmt: skip
    caption = (
        "Top: each head's copying score (row 1) against the scores of random matrices of the same shapes "
        "(row 0; red: above the 99th percentile, blue: below it). Below: eigenvalues of each head's full "
        "OV circuit W_E W_V W_O W_U (green: positive real part, copying; purple: negative). "
        f"{copying.copying_heads} of {len(copying.heads)} heads score above {copying.threshold:+.2f}, the "
        f"99th percentile of random matrices of the same shapes (mean {copying.baseline_mean:+.2f})."
    )
    claim = "most one-layer heads copy: their OV eigenvalues are mostly positive (10 of 12 heads)."
    return figure(against + f"<div class='grid'>{plots}</div>", caption, claim)


def spectra_section(r: Results) -> str:
    spectra = r.spectra
    if spectra is None:
        return ""
    scores = {h.name: h.copying_score for h in r.copying.heads} if r.copying else {}
    parts = ["<h3>Spectra over the whole vocabulary</h3>"]
    for circuit, rows, formula in (
        ("OV", spectra.OV, "W_E W_V W_O W_U"),
        ("QK", spectra.QK, "W_E W_Q W_K^T W_E^T / sqrt(d_head)"),
    ):
        header = ["head", "norm", "singular values (top 3)", "effective rank"]
        header += ["eigenvalue copying score"] if circuit == "OV" else []
        cells = [
            [h.name, h.norm, " ".join(f"{x:.3g}" for x in h.singular_values[:3]), h.effective_rank]
            + ([scores.get(h.name)] if circuit == "OV" else [])
            for h in rows
        ]
        parts.append(f"<h4>{circuit}: {esc(formula)}</h4>" + table(header, cells))
    parts.append(
        "<p class='small'>Frobenius norm, largest singular values and effective rank (exp of the entropy of "
        "s²/Σs²) of each head's token-to-token circuit, from factors shared by every head (no "
        "vocabulary-sized matrix is built); for OV, the copying score Re(Σλ)/Σ|λ| of the copying section.</p>"
    )
    return "".join(parts)


def copying_direct_section(r: Results) -> str:
    rows = r.copying_direct
    if not rows:
        return ""

    def top1(d) -> str:
        return f"{d.self_top1:.3f}" + (
            "" if d.self_top1_ci is None else " [{:.3f}, {:.3f}]".format(*d.self_top1_ci)
        )

    header = ["head", "diagonal mean", "diagonal z", "median self rank", "self is top logit", "rows scored"]
    cells = [
        [
            d.name,
            d.diagonal_mean,
            d.diagonal_z,
            d.self_rank_median,
            top1(d),
            f"{d.rows}{'' if d.exact else ' (sample)'}",
        ]
        for d in rows
    ]
    sampled = (
        ""
        if rows[0].exact
        else f" The rank and top-logit columns come from {rows[0].rows} rows drawn at random, each exact, "
        "with 95% Wilson intervals."
    )
    return (
        "<h3>Direct copying measures</h3>"
        + table(header, cells)
        + "<p class='small'>Each token's effect on its own logit through the head's full OV circuit: the "
        "diagonal, its z-score within the row, the token's rank among all outputs of its row, and how "
        f"often it is the row's maximum.{sampled}</p>"
    )


def copying_comparison_section(r: Results) -> str:
    rows = r.copying_comparison
    if not rows or r.copying is None or r.copying_direct is None:
        return ""
    scores = {h.name: h.copying_score or 0.0 for h in r.copying.heads}
    z = {d.name: d.diagonal_z for d in r.copying_direct}
    points = [
        {"x": scores[c.name], "y": z[c.name], "text": c.name, "colour": RED if c.disagree else BLUE,
         "label": f"{c.name}: eigenvalue score {scores[c.name]:+.2f}, diagonal z {z[c.name]:+.2f}"}
        for c in rows
    ]  # fmt: skip
    top = max(max(abs(v) for v in z.values()), 1.0) * 1.1
    plot = scatter(
        points,
        "eigenvalue copying score",
        "diagonal z-score",
        (-1, 1),
        (-top, top),
        "eigenvalues against direct copying",
    )
    disagree = [c for c in rows if c.disagree]
    listed = ", ".join(
        f"{c.name} (eigenvalues: {'copying' if c.eigenvalues_say_copying else 'not'}, direct: "
        f"{'copying' if c.direct_says_copying else 'not'})"
        for c in disagree
    )
    return figure(
        plot,
        f"Each head's eigenvalue copying score against the z-score of its own-logit effect (red: the two "
        f"verdicts of compare_copying disagree). Heads where they disagree: {listed or 'none'}.",
        "the eigenvalue statistic summarises copying; whether it is a reliable test is one of the paper's "
        "open questions.",
    )


def attention_figure(example: AttentionExample, strings: list[str]) -> str:
    data = {"strings": [shown(strings[t]) for t in example.tokens], "patterns": example.patterns}
    viewer = (
        f"<div class='attention-viewer'><script type='application/json'>{json_for_script(data)}</script>"
        "<div class='heads'></div><div class='status small'></div><div class='tokens'></div></div>"
    )
    labels = [shown(strings[t]) for t in example.tokens]
    static = attention_scale() + "".join(
        f"<div><div class='small'>{esc(name)}</div>{attention_grid(name, pattern, labels)}</div>"
        for name, pattern in example.patterns.items()
    )
    return figure(
        viewer + f"<div class='grid'>{static}</div>",
        f"Attention on {example.description}. Pick a head and hover a token to see where it attends (needs "
        "JavaScript); below, every head's pattern (rows: destination, columns: source; hover a cell for "
        "its weight).",
        "previous-token heads attend one back; induction heads attend to the token after the earlier "
        "occurrence of the current token (an off-diagonal stripe one period back).",
    )


def attention_section(r: Results) -> str:
    attention = r.attention_examples
    if attention is None:
        return ""
    examples = [e for e in (attention.repeated, attention.corpus, attention.user) if e is not None]
    return "<h3>Attention patterns</h3>" + "".join(attention_figure(e, r.tokens) for e in examples)


def position_content_section(r: Results) -> str:
    terms = r.qk_position_content
    if not terms:
        return ""
    names = list(next(iter(terms.values())))
    rows = [[name, *(terms[term][name] for term in terms)] for name in names]
    return (
        "<h3>Position versus content in the attention scores</h3>"
        + table(["head", *(term.replace("_", "-") for term in terms)], rows)
        + "<p class='small'>Root mean square of each token/position term of every head's attention "
        "scores (query side first): where a head looks by content, by position, or by both.</p>"
    )


def _trigram_table(rows: list[SkipTrigram], bugs: list[SkipTrigramBug], strings: list[str]) -> str:
    if not rows:
        return "<p class='small'>No skip-trigram: no destination prefers any source (a flat QK circuit).</p>"
    bug_pairs = {(bug.source, d, o) for bug in bugs for d, o in (bug.first, bug.second)}
    shown_rows = rows[:12]
    cells = [
        [tok(strings[t.source]), tok(strings[t.destination]), tok(strings[t.out]), t.qk, t.ov, t.strength]
        for t in shown_rows
    ]
    classes = ["bug" if (t.source, t.destination, t.out) in bug_pairs else "" for t in shown_rows]
    return table(["source …", "destination", "→ out", "QK", "OV", "strength"], cells, classes)


def _crossed(bug: SkipTrigramBug, strings: list[str]) -> Raw:
    seen = {None: "", True: " seen in corpus", False: " <span class='never'>never in corpus</span>"}
    lines = [
        f"{tok(strings[c.destination])} → {tok(strings[c.out])} (strength {c.strength:.2f})"
        + seen[c.in_corpus]
        for c in bug.crossed
    ]
    return Raw("<br>".join(lines))


def _bug_table(bugs: list[SkipTrigramBug], strings: list[str]) -> str:
    if not bugs:
        return ""

    def pairs(bug: SkipTrigramBug) -> Raw:
        return Raw(" and ".join(f"{tok(strings[d])} → {tok(strings[o])}" for d, o in (bug.first, bug.second)))

    rows = [[tok(strings[bug.source]), pairs(bug), _crossed(bug, strings)] for bug in bugs[:5]]
    return (
        "<p class='small'>Bugs: pairs of strong skip-trigrams sharing a source force the crossed ones.</p>"
        + table(["source", "strong (destination, out) pairs", "forced crossings"], rows)
    )


def _percent(share: float | None) -> str:
    return "—" if share is None else f"{100 * share:.3g}%"


def _bug_cost(cost: BugCost | None, strings: list[str]) -> str:
    if cost is None:
        return ""
    heads = [
        [name, f"{by:.3g}", f"{cost.head_gain[name]:.4f}", _percent(cost.share_by_head[name])]
        for name, by in cost.by_head.items()
    ]
    top = [
        [
            t.head,
            tok(strings[t.source]),
            tok(strings[t.destination]),
            tok(strings[t.out]),
            t.fires,
            f"{t.nats_per_token:.3g}",
        ]
        for t in cost.top
    ]
    return (
        "<h4>What the bugs cost</h4>"
        f"<p>The {cost.terms} bugged terms (crossed skip-trigrams never seen in the corpus: each head's OV "
        "contribution to the crossed output where it fires, attention frozen) cost "
        f"{cost.nats_per_token:.3g} nats per token on {esc(cost.tokens)} (the loss with them minus the "
        f"loss without): {_percent(cost.share)} of the {cost.heads_gain:.4f} nats the heads gain over the "
        "direct path.</p>"
        + table(["head", "bug cost (nats/token)", "head's gain over the direct path", "share"], heads)
        + table(["head", "source …", "destination", "→ crossed out", "fires", "cost (nats/token)"], top)
    )


def skip_trigram_section(r: Results) -> str:
    trigrams = r.skip_trigrams
    if trigrams is None:
        return ""
    parts = ["<h3>Skip-trigrams</h3>"]
    for name, rows in trigrams.tables.items():
        bugs = trigrams.bugs.get(name, [])
        parts.append(
            f"<h4>{esc(name)}</h4>" + _trigram_table(rows, bugs, r.tokens) + _bug_table(bugs, r.tokens)
        )
    parts.append(
        "<p class='claim'>Paper: one-layer heads implement skip-trigrams [source] … [destination] → [out], "
        'and because QK and OV factor through the source, strong pairs force crossed ones ("keep … in '
        'mind", "keep … at bay" → "keep … in bay").</p>'
    )
    return "".join(parts) + _bug_cost(trigrams.bug_cost, r.tokens)


def composition_section(r: Results) -> str:
    composition = r.composition
    if composition is None:
        return ""
    grids = {}
    for kind, pairs in (("Q", composition.Q), ("K", composition.K), ("V", composition.V)):
        writers = sorted({p.writer for p in pairs}, key=parse_head)
        readers = sorted({p.reader for p in pairs}, key=parse_head)
        for title, value in (("baseline subtracted", lambda p: p.score), ("raw", lambda p: p.raw)):
            grid = {(p.writer, p.reader): value(p) for p in pairs}
            grids[kind, title] = (writers, readers, [[grid.get((w, rd)) for rd in readers] for w in writers])
    limit = shared_limit(*(values for _, _, values in grids.values()))  # one scale for all six
    figures = []
    for (kind, title), (writers, readers, values) in grids.items():
        baseline = composition.baseline if title == "raw" else 0.0
        chart = heatmap(
            values, writers, readers, limit, label=f"{kind}-composition {title}", scale=f"{kind} {title}",
            marks=[(baseline, "random")],
        )  # fmt: skip
        figures.append(f"<div><div class='small'>{kind}-composition, {title}</div>{chart}</div>")
    return figure(
        f"<div class='grid'>{''.join(figures)}</div>",
        "Composition scores, rows: earlier head, columns: later head; one colour scale for the six maps "
        f"(red above zero, blue below, saturating at ±{limit:.3g}). The baseline "
        f"({composition.baseline:.3f}, dashed 'random' on each colour bar: 0 once subtracted) is the "
        "expected score of random heads of the same shapes; TransformerLens reports the raw score.",
        "only K-composition with the previous-token head stands out (the corrected paper adds that the "
        "Q- and V-composition seen earlier came from a bug in its low-rank library).",
    )


def induction_section(r: Results) -> str:
    rows, repeated = r.induction_check, r.repeated_tokens
    if not rows or repeated is None:
        return ""
    scores = {h.name: h.induction_score for h in repeated.heads}
    points = []
    for row in rows:
        copying = row.ov_copying if row.ov_copying is not None else 0.0
        label = (
            f"{row.head}: copying {copying:+.2f}, K-composition with {row.writer} "
            f"{row.k_composition_positivity:+.2f}, induction {scores[row.head] or 0.0:.2f}"
        )
        colour = RED if row.head in repeated.induction_heads else BLUE
        points.append(
            {
                "x": copying,
                "y": row.k_composition_positivity,
                "label": label,
                "text": row.head,
                "colour": colour,
            }
        )
    plot = scatter(
        points,
        "OV copying score",
        "K-composition positivity (best earlier head)",
        (-1, 1),
        (-1, 1),
        "induction corner plot",
    )
    return figure(
        plot,
        "Each later-layer head: its OV copying score against the eigenvalue positivity of its token-level "
        "K-composition term with the earlier head that gives the strongest (red: induction score above "
        f"{repeated.induction_threshold}).",
        "induction heads sit in the top-right corner: they copy, and match 'same token' through the "
        "previous-token head.",
    )


def _share(value: float | None) -> str:
    return "—" if value is None else f"{value:+.2f}"


def induction_mechanism_section(r: Results) -> str:
    rows = r.induction_mechanism
    if not rows:
        return ""
    body = [
        [
            row.head,
            row.mechanism,
            *(_share(row.shares[group]) for group in ("k_composition", "pointer", "other")),
            row.margin,
            row.writer,
            ", ".join(f"{t.query} × {t.key} {_share(t.share)}" for t in row.top_terms),
        ]
        for row in rows
    ]
    header = ["head", "mechanism", "K-composition", "pointer", "other", "margin", "writer", "largest terms"]
    return figure(
        table(header, body),
        f"Each induction head's pre-softmax margin on the induction target (score there minus the mean "
        f"score elsewhere) on {rows[0].tokens} of period {rows[0].period}, split exactly into (query part "
        "× key part) terms with earlier attention and LayerNorm scales frozen; shares sum to 1. "
        "K-composition: the current token × an earlier head's write of its source's token; pointer: "
        "position parts on both sides, one of them an earlier head's; the mechanism is the group with "
        "the largest share when it has at least half.",
        "the two-layer models' induction heads K-compose with a previous-token head; one GPT-2 induction "
        "head instead uses pointer arithmetic on positions.",
    )


def _recent_table(found) -> str:
    rows = [
        [h.head, h.window, ", ".join(f"{o:.2f}" for o in h.offsets), _share(h.key_position_share)]
        + ["yes" if h.recent else "no"]
        for h in found.heads
    ]
    header = ["head", "window k", "attention at offsets 0, 1, ...", "key position share", "several recent"]
    return figure(
        table(header, rows),
        f"Several-recent-tokens heads on {found.tokens}: a head's window k is the fewest last tokens "
        f"(the current one included) holding {found.recent_mass:.0%} of its attention (at most "
        f"{found.window_max}); it is a several-recent-tokens head when k is at least 2, no single offset "
        f"holds {found.spread:.0%} of its attention, and positional key parts carry at least "
        f"{found.positional_key_share:.0%} of its scores' variation. Found: "
        f"{', '.join(found.recent_heads) or 'none'}.",
        "the corrected paper: induction heads also rely on a head which attends to the last several tokens.",
    )


def _writers_table(found) -> str:
    if not found.writers:
        return ""
    earlier = sorted({w for row in found.writers for w in row.key}, key=parse_head)
    body = [
        [row.head, *(_share(row.key[w]) for w in earlier), _share(row.beyond_previous)]
        for row in found.writers
    ]
    return figure(
        table(["induction head", *(f"{w} (key)" for w in earlier), "beyond previous-token"], body),
        f"Each earlier head's share of an induction head's score margin on the induction target through "
        f"its key side (all of its parts: token, position, bias), on {found.tokens} of period "
        f"{found.period}; exact with earlier attention frozen. The last column sums the earlier heads "
        "that are not previous-token heads.",
    )


def _minimal_text(found) -> str:
    m = found.minimal
    if m is None:
        return ""
    share = (
        "undefined (removing the induction heads changes nothing)" if m.share is None else f"{m.share:.0%}"
    )
    return figure(
        table(
            ["induction heads", "keyed by", "loss: full", "minimal circuit", "heads removed", "share"],
            [[", ".join(m.induction_heads), ", ".join(m.previous_token_heads), m.loss_full, m.loss_minimal,
              m.loss_without, share]],
        ),
        "The minimal circuit (the induction head's query reads the current token, its key the "
        "previous-token head's write of its source's token, its value the token; attention elsewhere "
        "frozen): share = (loss without the heads - loss minimal) / (loss without - loss full), loss "
        "on the repeats after the first. Causal scrubbing reports 35% for this naive hypothesis and "
        "89% for a refined one on a 2-layer model.",
    )  # fmt: skip


def correction_section(r: Results) -> str:
    found = r.correction
    if found is None:
        return ""
    return _recent_table(found) + _writers_table(found) + _minimal_text(found)


def circuit_section(r: Results) -> str:
    circuit = r.circuit
    if circuit is None:
        return ""
    layers: list[list[tuple[str, str]]] = []
    for node in circuit.nodes:
        while len(layers) <= node.layer:
            layers.append([])
        layers[node.layer].append((node.head, ", ".join(role.replace("_", " ") for role in node.roles)))
    edges = [(e.writer, e.reader, e.kind, e.weight) for e in circuit.edges]
    rows = [[e.writer, e.reader, e.kind, f"{e.weight:+.2f}", e.name] for e in circuit.edges]
    return figure(
        circuit_diagram(layers, edges, "circuit graph")
        + table(["writer", "reader", "kind", "weight", "ACDC name"], rows),
        f"The circuit read off the weights on {circuit.tokens}: heads with their roles, and every "
        f"Q-, K- and V-composition edge whose share of what the reader reads is at least "
        f"{circuit.threshold:g} in size (Q, K: of the variation of its scores; V: of its write), with "
        "attention and LayerNorm scales frozen. Dashed: a negative share.",
    )


def ablation_section(r: Results) -> str:
    effects = r.ablation
    if not effects:
        return ""
    later = sorted({name for e in effects for name in e.induction_change}, key=parse_head)
    rows = [f"{e.head} ({e.mode})" for e in effects]
    induction = [[e.induction_change.get(name) for name in later] for e in effects]
    loss = [[e.loss_change[-1]] for e in effects]
    every = 2 * r.config.n_heads * (r.config.n_layers - 1)  # both modes, every head read by a later layer
    rerun = (
        "every ablation rerun exactly"
        if len(effects) == every
        else f"exact reruns of the {len(effects)} of {every} ablations the first-order estimate ranks "
        "highest (below)"
    )
    charts = heatmap(
        induction, rows, later, 1.0, label="ablation effects", scale="induction change"
    ) + heatmap(loss, rows, ["loss, last repeat"], label="ablation loss change", scale="loss change (nats)")
    return figure(
        f"<div class='grid'>{charts}</div>",
        "Left: change in each later head's induction score (from -1 to +1, the scale's ends); right: "
        "change in the loss on the last repeat (nats, its own scale), when an earlier head's write is "
        f"ablated ({ablation_modes(e.mode for e in effects)}), on "
        f"{effects[0].sequences} sequence(s) of random tokens repeating every {effects[0].period} "
        f"positions: {rerun}. Red: the score or the loss rises; blue: it falls.",
        "ablating the previous-token head breaks the induction heads.",
    )


def ablation_modes(modes) -> str:
    """What each ablation mode used means, in the order first used: ``zero: replaced by zero ...``."""
    return "; ".join(f"{esc(mode)}: {MEANINGS.get(mode, mode)}" for mode in dict.fromkeys(modes))


ESTIMATES_SHOWN = 24  # the largest estimated ablations listed in the report (results.json has all)


def ablation_estimate_section(r: Results) -> str:
    estimate = r.ablation_estimate
    if estimate is None:
        return ""
    rows = [
        [a.head, a.mode, a.estimated, "—" if a.exact is None else a.exact]
        for a in estimate.ablations[:ESTIMATES_SHOWN]
    ]
    rho = "" if estimate.rank_correlation is None else f", Spearman's ρ {estimate.rank_correlation:.3f}"
    return figure(
        table(["head", "ablation", "estimated change", "exact change"], rows),
        f"Every ablation's change in the {esc(estimate.metric)} (clean {estimate.clean:.4f} nats), "
        f"estimated to first order by attribution patching (one forward and one backward pass for "
        f"every head: the gradient at each head's write times the ablation's change of it) on "
        f"{esc(estimate.tokens)}, {estimate.sequences} sequence(s) of period {estimate.period}; the "
        f"largest {len(rows)} of {len(estimate.ablations)} "
        f"({ablation_modes(a.mode for a in estimate.ablations)}). Exact: a rerun with the head ablated "
        f"({estimate.exact} of them{rho}); '—': estimated only.",
        "the estimate ranks the heads that matter first; where it and the rerun differ, the rerun is "
        "the number.",
    )


def term_importance_section(r: Results) -> str:
    importance = r.term_importance
    if importance is None:
        return ""
    order_bars = [(f"order {n + 1}", m) for n, m in enumerate(importance.marginal)]
    head_bars = [
        (head_name(layer, head), v)
        for layer, row in enumerate(importance.first_order_by_head)
        for head, v in enumerate(row)
    ]
    losses = ", ".join(f"order ≤ {n}: {v:.3f}" for n, v in enumerate(importance.loss_by_order))
    charts = bars(
        order_bars, "loss reduction (nats) when the paths of this order are added", "term importance by order"
    ) + bars(head_bars, "loss reduction of each head's first-order term alone", "first-order terms by head")
    return figure(
        charts,
        f"Term importance on {importance.tokens}: loss with paths up to each order kept ({losses}).",
        "the direct path and first-order terms carry most of the loss reduction; virtual heads (second "
        "order) matter little.",
    )


NEURON_TOKENS_SHOWN = 5  # tokens per list in the report (results.json keeps k)


def _neuron_tokens(ids: list[int], strings: list[str]) -> Raw:
    return Raw(" ".join(str(tok(strings[i])) for i in ids[:NEURON_TOKENS_SHOWN]))


def _neuron_table(layer: LayerNeurons, strings: list[str]) -> str:
    on_data = layer.neurons and layer.neurons[0].on_data is not None
    header = ["neuron", "logit effect", "excited by", "raises", "lowers"]
    header += ["mean activation", "target logit", "|target logit|"] if on_data else []
    rows = []
    for n in layer.neurons:
        row = [f"L{n.layer}N{n.neuron}", n.logit_effect]
        row += [_neuron_tokens(ids, strings) for ids in (n.excited_by, n.raises, n.lowers)]
        if n.on_data is not None:
            row += [n.on_data.mean_activation, n.on_data.target_logit, n.on_data.target_logit_abs]
        rows.append(row)
    return f"<h4>Layer {layer.layer}: ranked by {esc(layer.ranked_by)}</h4>" + table(header, rows)


def neurons_section(r: Results) -> str:
    neurons = r.neurons
    if neurons is None:
        return ""
    data = (
        f" The last layer on {neurons.data}: each neuron's exact direct contribution to the target "
        f"logit (its activation times W_out[n] through ln_final at its frozen scale and W_U), averaged "
        f"over positions; with the rest of the logits it sums to the model's to {neurons.max_error:.1e}."
        if neurons.data is not None
        else ""
    )
    return figure(
        "".join(_neuron_table(layer, r.tokens) for layer in neurons.layers),
        f"Each MLP layer's top {neurons.top} neurons read through the direct path, on the LayerNorm-folded "
        "weights at unit LayerNorm scale: the tokens whose embedding most excites the neuron (its key: "
        "W_E W_in[:, n]) and the tokens whose logits its write most raises and lowers (its value: "
        f"W_out[n] W_U), {NEURON_TOKENS_SHOWN} of the {neurons.k} in results.json. Logit effect: the "
        "root mean square over the vocabulary of W_out[n] W_U." + data,
        "MLP neurons can be read as keys (what they respond to) and values (what they write); in the "
        "last layer their effect on the logits is linear once the activations are given.",
    )


def task_section(r: Results) -> str:
    task = r.task
    if task is None:
        return ""
    rows = [[a.head, a.mode, a.loss, a.loss_change, a.accuracy, a.accuracy_change] for a in task.ablations]
    return (
        "<h3>The model on its own task</h3>"
        + f"<p>On {esc(task.data)}: loss {task.loss:.4f} nats, accuracy {task.accuracy:.4f}, mean "
        f"probability of the target {task.mean_target_probability:.4f}, over the {task.positions} "
        f"position(s) with a target in {task.sequences} sequence(s).</p>"
        + table(["head", "ablation", "loss", "loss change", "accuracy", "accuracy change"], rows)
        + f"<p class='small'>Each head's write ablated on this data "
        f"({ablation_modes(a.mode for a in task.ablations)}): a loss that rises and an accuracy that "
        "falls say the task needs the head.</p>"
    )


def skipped_section(r: Results) -> str:
    if not r.skipped:
        return ""
    rows = [[name, reason] for name, reason in r.skipped.items()]
    return "<h3>Analyses that did not apply</h3>" + table(["analysis", "why"], rows)


# Page order; keyed by the Results field each one shows ("heads" joins copying and repeated_tokens).
SECTIONS: dict[str, Callable[[Results], str]] = {
    "training": training_section,
    "bigram": bigram_section,
    "repeated_tokens": heads_section,
    "spectra": spectra_section,
    "copying": copying_section,
    "copying_direct": copying_direct_section,
    "copying_comparison": copying_comparison_section,
    "skip_trigrams": skip_trigram_section,
    "attention_examples": attention_section,
    "qk_position_content": position_content_section,
    "composition": composition_section,
    "induction_check": induction_section,
    "induction_mechanism": induction_mechanism_section,
    "correction": correction_section,
    "circuit": circuit_section,
    "ablation": ablation_section,
    "neurons": neurons_section,
    "ablation_estimate": ablation_estimate_section,
    "term_importance": term_importance_section,
    "task": task_section,
    "skipped": skipped_section,
}
