"""One layer: skip-trigram tables, their bugs, and what the bugs cost."""

from __future__ import annotations

from qkov.circuits.skip_trigrams import BugCost, SkipTrigram, SkipTrigramBug
from qkov.report.markup import Raw, table, tok
from qkov.report.svg import esc
from qkov.results import Results


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
        f"direct path. It covers {esc(cost.covers or 'the crossings listed above')}.</p>"
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
