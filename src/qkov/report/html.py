"""One self-contained HTML page from analysis results: inline CSS and SVG, one small inline script
for the interactive attention viewer (everything else is static), nothing fetched. Every token
string and every other text from the results is escaped (corpus text is untrusted); the viewer's
data is embedded as JSON with ``<``, ``>`` and ``&`` escaped, and inserted as text, never as HTML.
"""

from __future__ import annotations

import json

from qkov.report.svg import bars, esc, heatmap, line_chart, scatter, sequential

CSS = """
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em; color: #222; }
h1 { font-size: 1.6em; } h2 { border-bottom: 2px solid #ccc; padding-bottom: .2em; margin-top: 2em; }
table { border-collapse: collapse; margin: .5em 0 1em; font-size: .9em; }
th, td { border: 1px solid #ddd; padding: .25em .5em; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.holds { background: #e5f5e0; } .fails { background: #fde0dd; }
figure { margin: 1em 0; } figcaption { font-size: .88em; color: #444; max-width: 900px; }
.claim { font-style: italic; color: #555; }
code, .tok { font-family: ui-monospace, monospace; white-space: pre; }
.tok { border: 1px solid #eee; padding: 0 1px; margin: 1px; display: inline-block; cursor: default; }
.tok.selected { outline: 2px solid #d62728; }
.bug { background: #fff3cd; } .never { color: #b00; font-weight: 600; }
.grid { display: flex; flex-wrap: wrap; gap: 1em; } .small { font-size: .85em; color: #555; }
button.head { margin: 2px; } button.head.active { background: #1f77b4; color: white; }
"""

VIEWER_JS = """
document.querySelectorAll('.attention-viewer').forEach(function (viewer) {
  var data = JSON.parse(viewer.querySelector('script[type="application/json"]').textContent);
  var heads = Object.keys(data.patterns);
  var current = heads[0];
  var buttons = viewer.querySelector('.heads');
  var text = viewer.querySelector('.tokens');
  var status = viewer.querySelector('.status');
  heads.forEach(function (name) {
    var b = document.createElement('button');
    b.className = 'head'; b.textContent = name;
    b.addEventListener('click', function () { current = name; paint(-1); });
    buttons.appendChild(b);
  });
  var spans = data.strings.map(function (s, i) {
    var span = document.createElement('span');
    span.className = 'tok'; span.textContent = s;
    span.addEventListener('mouseenter', function () { paint(i); });
    text.appendChild(span);
    return span;
  });
  function paint(dest) {
    buttons.querySelectorAll('button').forEach(function (b) { b.classList.toggle('active', b.textContent === current); });
    spans.forEach(function (span, src) {
      var w = dest >= 0 && src <= dest ? data.patterns[current][dest][src] : 0;
      span.style.background = 'rgba(31,119,180,' + w + ')';
      span.classList.toggle('selected', src === dest);
    });
    status.textContent = dest >= 0 ? current + ': attention from token ' + dest + ' (hover another token)' : current + ': hover a token to see where it attends';
  }
  paint(-1);
});
"""


def _json_for_script(data: object) -> str:
    """JSON safe inside ``<script>``: no ``</script>``, no HTML entities."""
    return json.dumps(data).replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def _table(header: list[str], rows: list[list[object]], classes: list[str] | None = None) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = []
    for i, row in enumerate(rows):
        cells = "".join(
            f'<td class="num">{cell:.3f}</td>'
            if isinstance(cell, float)
            else f"<td>{cell if isinstance(cell, Raw) else esc(cell)}</td>"
            for cell in row
        )
        cls = f' class="{classes[i]}"' if classes and classes[i] else ""
        body.append(f"<tr{cls}>{cells}</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


class Raw(str):
    """Already-escaped HTML for a table cell."""


def _figure(content: str, caption: str, claim: str | None = None) -> str:
    claim_html = f' <span class="claim">Paper: {esc(claim)}</span>' if claim else ""
    return f"<figure>{content}<figcaption>{esc(caption)}{claim_html}</figcaption></figure>"


def shown(text: str) -> str:
    """A token as it is displayed: newlines and tabs made visible, so whitespace tokens (common in
    code) do not render as blank boxes."""
    return text.replace("\n", "↵").replace("\t", "⇥")


def _tok(text: str) -> Raw:
    return Raw(f'<span class="tok">{esc(shown(text))}</span>')


# -- sections --------------------------------------------------------------------------------------
def claims_section(claims: list[dict]) -> str:
    rows = [[c["claim"], c["paper"], c["measured"], "yes" if c["holds"] else "no"] for c in claims]
    classes = ["holds" if c["holds"] else "fails" for c in claims]
    held = sum(c["holds"] for c in claims)
    return (
        f'<section id="claims"><h2>Claims: {held} of {len(claims)} hold</h2>'
        + _table(["claim", "paper", "measured here", "holds"], rows, classes)
        + "</section>"
    )


def training_section(r: dict) -> str:
    log = r.get("training") or []
    if not log:
        return ""
    loss = {
        "train loss": [(row["tokens"], row.get("train_loss")) for row in log],
        "eval loss": [(row["tokens"], row.get("eval_loss")) for row in log],
    }
    change = r.get("phase_change")
    marks = [(change["onset_tokens"], "10%"), (change["complete_tokens"], "90%")] if change else []
    parts = [
        _figure(
            line_chart(loss, "tokens seen", "loss (nats)", marks, "training loss"), "Training and eval loss."
        )
    ]
    if any(row.get("induction_score") is not None for row in log):
        behaviour = {
            "loss on 2nd repeat": [(row["tokens"], row.get("repeat_loss_second")) for row in log],
            "loss on 1st repeat": [(row["tokens"], row.get("repeat_loss_first")) for row in log],
        }
        scores = {
            "best induction score": [(row["tokens"], row.get("induction_score")) for row in log],
            "best previous-token score": [(row["tokens"], row.get("previous_token_score")) for row in log],
        }
        parts.append(
            _figure(
                line_chart(behaviour, "tokens seen", "loss (nats)", marks, "in-context loss during training")
                + line_chart(scores, "tokens seen", "attention score", marks, "head scores during training"),
                "Loss on repeated random tokens and the best head scores during training; the dashed lines mark "
                "where the best induction score passed 10% and 90% of its rise.",
                "induction heads form in a sudden phase change, visible as a drop in the loss on repeated tokens.",
            )
        )
    return "<h3>Training</h3>" + "".join(parts)


def bigram_section(r: dict, strings: list[str]) -> str:
    b = r.get("bigram")
    if not b:
        return ""
    rows = [
        [_tok(strings[e["token"]]), e["count"],
         Raw(" ".join(f"{_tok(strings[t])}&nbsp;{p:.2f}" for t, p in e["corpus"])),
         Raw(" ".join(f"{_tok(strings[t])}&nbsp;{p:.2f}" for t, p in e["model"]))]
        for e in b["examples"]
    ]  # fmt: skip
    return (
        "<h3>Direct path as a bigram table</h3>"
        f"<p>Over the {b['tokens_compared']} most common tokens: correlation of log P(next | current) between "
        f"the direct path W<sub>E</sub>W<sub>U</sub> and the corpus {b['correlation']:.3f} ({b['pairs_compared']} pairs); "
        f"KL(corpus || model) {b['kl']:.3f} nats against a corpus conditional entropy of {b['corpus_entropy']:.3f}.</p>"
        + _table(["token", "count", "corpus: top next tokens", "direct path: top next tokens"], rows)
    )


def heads_section(r: dict) -> str:
    heads = r.get("heads") or []
    if not heads:
        return ""
    keys = [
        "copying_score",
        "self_top1",
        "diagonal_z",
        "previous_token_score",
        "induction_score",
        "duplicate_token_score",
    ]
    rows = [[h["name"], *[h.get(k) if h.get(k) is not None else "—" for k in keys]] for h in heads]
    return "<h3>Heads</h3>" + _table(
        [
            "head",
            "OV copying (eigenvalues)",
            "self is top logit",
            "diagonal z",
            "previous-token",
            "induction",
            "duplicate-token",
        ],
        rows,
    )


def copying_section(r: dict) -> str:
    c = r.get("copying")
    if not c:
        return ""
    figures = []
    for head in r["heads"]:
        eig = c["eigenvalues"][head["name"]]
        limit = max((abs(complex(re, im)) for re, im in eig), default=1.0) or 1.0
        points = [
            {"x": re, "y": im, "label": f"{re:+.3g}{im:+.3g}i", "colour": "#1f77b4" if re >= 0 else "#d62728"}
            for re, im in eig
        ]
        figures.append(
            f"<div><div class='small'>{esc(head['name'])}: score {head['copying_score']:+.2f}</div>"
            + scatter(
                points,
                "Re λ",
                "Im λ",
                (-limit, limit),
                (-limit, limit),
                f"eigenvalues of {head['name']}",
                220,
                200,
                radius=2.5,
            )
            + "</div>"
        )
    points = [{"x": x, "y": 0.0, "label": f"random: {x:+.3f}", "colour": "#999999"} for x in c["baseline"]]
    points += [
        {"x": h["copying_score"], "y": 0.8 + 0.2 * (i % 3), "label": f"{h['name']}: {h['copying_score']:+.3f}", "text": h["name"],
         "colour": "#d62728" if h["copying_score"] > c["threshold"] else "#1f77b4"}
        for i, h in enumerate(r["heads"])  # staggered so that close scores keep readable labels
    ]  # fmt: skip
    against = scatter(
        points,
        "copying score (0: random, 1: heads; red: above the 99th percentile)",
        "",
        (-1, 1),
        (-0.5, 1.5),
        "copying scores against the random baseline",
        700,
        180,
    )
    return _figure(
        against + f"<div class='grid'>{''.join(figures)}</div>",
        f"Top: each head's copying score (row 1) against the scores of random matrices of the same shapes (row 0). "
        f"Below: eigenvalues of each head's full OV circuit W_E W_V W_O W_U. {c['copying_heads']} of {len(r['heads'])} heads "
        f"score above {c['threshold']:+.2f}, the 99th percentile of random matrices of the same shapes "
        f"(mean {c['baseline_mean']:+.2f}).",
        "most one-layer heads copy: their OV eigenvalues are mostly positive (10 of 12 heads).",
    )


def attention_section(r: dict, strings: list[str]) -> str:
    examples = r.get("attention_examples") or {}
    parts = []
    for key, title in (
        ("repeated", "repeated random tokens (16 tokens, three times)"),
        ("corpus", "a corpus snippet"),
    ):
        example = examples.get(key)
        if not example:
            continue
        data = {"strings": [shown(strings[t]) for t in example["tokens"]], "patterns": example["patterns"]}
        static = []
        for name, pattern in example["patterns"].items():
            n = len(pattern)
            cells = "".join(
                f'<rect x="{s * 3}" y="{d * 3}" width="3" height="3" fill="{sequential(w)}"/>'
                for d, row in enumerate(pattern) for s, w in enumerate(row) if w > 0.02
            )  # fmt: skip
            static.append(
                f"<div><div class='small'>{esc(name)}</div><svg class='figure pattern' role='img' aria-label='pattern {esc(name)}' "
                f"width='{n * 3}' height='{n * 3}' viewBox='0 0 {n * 3} {n * 3}' xmlns='http://www.w3.org/2000/svg'>"
                f"<rect width='{n * 3}' height='{n * 3}' fill='white' stroke='#ccc'/>{cells}</svg></div>"
            )
        parts.append(
            _figure(
                f"<div class='attention-viewer'><script type='application/json'>{_json_for_script(data)}</script>"
                "<div class='heads'></div><div class='status small'></div><div class='tokens'></div></div>"
                f"<div class='grid'>{''.join(static)}</div>",
                f"Attention on {title}. Pick a head and hover a token to see where it attends (needs JavaScript); "
                "below, every head's pattern (rows: destination, columns: source).",
                "previous-token heads attend one back; induction heads attend to the token after the earlier "
                "occurrence of the current token (an off-diagonal stripe one period back).",
            )
        )
    return "<h3>Attention patterns</h3>" + "".join(parts) if parts else ""


def skip_trigram_section(r: dict) -> str:
    tables = r.get("skip_trigrams")
    if not tables:
        return ""
    bugs = r.get("skip_trigram_bugs", {})
    parts = ["<h3>Skip-trigrams</h3>"]
    for name, trigrams in tables.items():
        head_bugs = bugs.get(name, [])
        bug_pairs = {(b["source"], d, o) for b in head_bugs for d, o in (b["first"], b["second"])}
        rows = [
            [
                _tok(t["source_str"]),
                _tok(t["destination_str"]),
                _tok(t["out_str"]),
                t["qk"],
                t["ov"],
                t["strength"],
            ]
            for t in trigrams[:12]
        ]
        classes = [
            "bug" if (t["source"], t["destination"], t["out"]) in bug_pairs else "" for t in trigrams[:12]
        ]
        bug_rows = [
            [
                _tok(b["source_str"]),
                Raw(" and ".join(f"{_tok(d)} → {_tok(o)}" for d, o in (b["first_str"], b["second_str"]))),
                Raw("<br>".join(
                    f"{_tok(c['destination_str'])} → {_tok(c['out_str'])} (strength {c['strength']:.2f})"
                    + ("" if c["in_corpus"] is None else (" seen in corpus" if c["in_corpus"] else " <span class='never'>never in corpus</span>"))
                    for c in b["crossed"]
                )),
            ]
            for b in head_bugs[:5]
        ]  # fmt: skip
        parts.append(
            f"<h4>{esc(name)}</h4>"
            + _table(["source …", "destination", "→ out", "QK", "OV", "strength"], rows, classes)
            + (
                "<p class='small'>Bugs: pairs of strong skip-trigrams sharing a source force the crossed ones.</p>"
                + _table(["source", "strong (destination, out) pairs", "forced crossings"], bug_rows)
                if bug_rows
                else ""
            )
        )
    parts.append(
        "<p class='claim'>Paper: one-layer heads implement skip-trigrams [source] … [destination] → [out], "
        'and because QK and OV factor through the source, strong pairs force crossed ones ("keep … in mind", '
        '"keep … at bay" → "keep … in bay").</p>'
    )
    return "".join(parts)


def composition_section(r: dict) -> str:
    composition = r.get("composition")
    if not composition:
        return ""
    figures = []
    for kind in ("Q", "K", "V"):
        entries = composition[kind]
        froms = sorted({e["from"] for e in entries}, key=_head_key)
        tos = sorted({e["to"] for e in entries}, key=_head_key)
        for field, title in (("score", "baseline subtracted"), ("raw", "raw")):
            grid = {(e["from"], e["to"]): e[field] for e in entries}
            values = [[grid.get((f, t)) for t in tos] for f in froms]
            figures.append(
                f"<div><div class='small'>{kind}-composition, {title}</div>"
                + heatmap(values, froms, tos, label=f"{kind}-composition {title}")
                + "</div>"
            )
    baseline = composition["K"][0]["baseline"] if composition["K"] else 0.0
    return _figure(
        f"<div class='grid'>{''.join(figures)}</div>",
        f"Composition scores, rows: earlier head, columns: later head. The baseline ({baseline:.3f}) is the expected "
        "score of random heads of the same shapes; TransformerLens reports the raw score.",
        "only K-composition with the previous-token head stands out (the corrected paper adds that the "
        "Q- and V-composition seen earlier came from a bug in its low-rank library).",
    )


def _head_key(name: str) -> tuple[int, int]:
    layer, head = name[1:].split("H")
    return int(layer), int(head)


def induction_section(r: dict) -> str:
    rows = r.get("induction_check")
    if not rows:
        return ""
    scores = {h["name"]: h.get("induction_score") or 0.0 for h in r["heads"]}
    points = [
        {
            "x": row["ov_copying"], "y": row["k_composition_positivity"],
            "label": f"{row['head']}: copying {row['ov_copying']:+.2f}, K-composition with {row['with']} {row['k_composition_positivity']:+.2f}, induction {scores[row['head']]:.2f}",
            "text": row["head"], "colour": "#d62728" if scores[row["head"]] > 0.3 else "#1f77b4",
        }
        for row in rows
    ]  # fmt: skip
    return _figure(
        scatter(
            points,
            "OV copying score",
            "K-composition positivity (best earlier head)",
            (-1, 1),
            (-1, 1),
            "induction corner plot",
        ),
        "Each later-layer head: its OV copying score against the eigenvalue positivity of its token-level "
        "K-composition term with the earlier head that gives the strongest (red: induction score above 0.3).",
        "induction heads sit in the top-right corner: they copy, and match 'same token' through the previous-token head.",
    )


def term_importance_section(r: dict) -> str:
    t = r.get("term_importance")
    if not t:
        return ""
    order_bars = [(f"order {n + 1}", m) for n, m in enumerate(t["marginal"])]
    head_bars = [
        (f"L{layer}H{head}", v)
        for layer, row in enumerate(t["first_order_by_head"])
        for head, v in enumerate(row)
    ]
    losses = ", ".join(f"order ≤ {n}: {v:.3f}" for n, v in enumerate(t["loss_by_order"]))
    return _figure(
        bars(
            order_bars,
            "loss reduction (nats) when the paths of this order are added",
            "term importance by order",
        )
        + bars(
            head_bars, "loss reduction of each head's first-order term alone", "first-order terms by head"
        ),
        f"Term importance on {t['tokens']}: loss with paths up to each order kept ({losses}).",
        "the direct path and first-order terms carry most of the loss reduction; virtual heads (second order) matter little.",
    )


def ablation_section(r: dict) -> str:
    effects = r.get("ablation")
    if not effects:
        return ""
    later = sorted({name for e in effects for name in e["induction_change"]}, key=_head_key)
    rows = [f"{e['head']} ({e['mode']})" for e in effects]
    values = [[e["induction_change"].get(name) for name in later] + [e["loss_change"][-1]] for e in effects]
    return _figure(
        heatmap(values, rows, later + ["loss, last repeat"], label="ablation effects"),
        "Change in each later head's induction score (and in the loss on the last repeat) when an earlier head's "
        "write is replaced by zero or by its mean.",
        "ablating the previous-token head breaks the induction heads.",
    )


def model_section(name: str, r: dict) -> str:
    cfg = r["config"]
    strings = r["tokens"]
    loss = r.get("in_context_loss")
    loss_html = (
        "<p>Loss on repeated random tokens, per repeat: "
        + " / ".join(f"{x:.2f}" for x in loss["repeats"])
        + " nats.</p>"
        if loss
        else ""
    )
    return (
        f'<section id="{esc(name)}"><h2>{esc(name)} model</h2>'
        f"<p class='small'>{esc(', '.join(f'{k} {v}' for k, v in cfg.items()))}</p>"
        + training_section(r)
        + bigram_section(r, strings)
        + heads_section(r)
        + loss_html
        + copying_section(r)
        + skip_trigram_section(r)
        + attention_section(r, strings)
        + composition_section(r)
        + induction_section(r)
        + ablation_section(r)
        + term_importance_section(r)
        + "</section>"
    )


def render_report(
    models: dict[str, dict], claims: list[dict] | None = None, title: str = "qkov report"
) -> str:
    """The whole page: the claims table first (when given), then one section per model."""
    nav = " · ".join(f'<a href="#{esc(name)}">{esc(name)}</a>' for name in models)
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>"
        f"<h1>{esc(title)}</h1><p class='small'>A Mathematical Framework for Transformer Circuits, read off the "
        f"weights by qkov. Models: {nav}</p>"
        + (claims_section(claims) if claims else "")
        + "".join(model_section(name, r) for name, r in models.items())
        + f"<script>{VIEWER_JS}</script></body></html>"
    )
