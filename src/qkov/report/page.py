"""One self-contained HTML page from analysis results: inline CSS and SVG, one small inline script
for the interactive attention viewer (everything else is static), nothing fetched. Every token
string and every other text from the results is escaped (corpus text is untrusted); the viewer's
data is embedded as JSON with ``<``, ``>`` and ``&`` escaped, and inserted as text, never as HTML.
"""

from __future__ import annotations

from qkov.report.sections import SECTIONS, claims_section, model_header, phase_change_section
from qkov.report.svg import esc
from qkov.results import Claim, Results

CSS = """
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em; color: #222; }
h1 { font-size: 1.6em; } h2 { border-bottom: 2px solid #ccc; padding-bottom: .2em; margin-top: 2em; }
table { border-collapse: collapse; margin: .5em 0 1em; font-size: .9em; }
th, td { border: 1px solid #ddd; padding: .25em .5em; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.holds { background: #e5f5e0; } .fails { background: #fde0dd; } .undetermined { background: #fff3cd; }
figure { margin: 1em 0; } figcaption { font-size: .88em; color: #444; max-width: 900px; }
.claim { font-style: italic; color: #555; }
code, .tok { font-family: ui-monospace, monospace; white-space: pre; }
.tok { border: 1px solid #eee; padding: 0 1px; margin: 1px; display: inline-block; cursor: default; }
.tok.selected { outline: 2px solid #d62728; }
.bug { background: #fff3cd; } .never { color: #b00; font-weight: 600; }
.grid { display: flex; flex-wrap: wrap; gap: 1em; } .small { font-size: .85em; color: #555; }
button.head { margin: 2px; } button.head.active { background: #1f77b4; color: white; }
"""

# The viewer initialises the viewers inside ``root``: the whole page here, one output's own element
# in a notebook (qkov.view), so that two outputs never initialise each other's.
VIEWER_JS = """
function qkovViewers(root) {
root.querySelectorAll('.attention-viewer').forEach(function (viewer) {
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
    buttons.querySelectorAll('button').forEach(function (b) {
      b.classList.toggle('active', b.textContent === current);
    });
    var top = 0;
    spans.forEach(function (span, src) {
      var w = dest >= 0 && src <= dest ? data.patterns[current][dest][src] : 0;
      span.style.background = 'rgba(31,119,180,' + w + ')';
      span.classList.toggle('selected', src === dest);
      span.title = src + ' ' + JSON.stringify(data.strings[src]) +
        (dest >= 0 && src <= dest ? ' · ' + current + ': attention from ' + dest + ': ' + w.toFixed(3) : '');
      if (w > (dest >= 0 ? data.patterns[current][dest][top] : 0)) top = src;
    });
    status.textContent = dest >= 0
      ? current + ': token ' + dest + ' attends most to ' + top + ' ' + JSON.stringify(data.strings[top]) +
        ' (' + data.patterns[current][dest][top].toFixed(2) + '); hover a token for its weight'
      : current + ': hover a token to see where it attends';
  }
  paint(-1);
});
}
"""


def model_section(name: str, r: Results) -> str:
    """One model: its settings, then each analysis's section in order (empty when it did not run)."""
    return (
        f'<section id="{esc(name)}"><h2>{esc(name)} model</h2>'
        + model_header(r)
        + "".join(section(r) for section in SECTIONS.values())
        + "</section>"
    )


def render_report(
    models: dict[str, Results], claims: list[Claim] | None = None, title: str = "qkov report"
) -> str:
    """The whole page: the claims table first (when given), the phase change across the models, then
    one section per model."""
    nav = " · ".join(f'<a href="#{esc(name)}">{esc(name)}</a>' for name in models)
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>"
        f"<h1>{esc(title)}</h1><p class='small'>A Mathematical Framework for Transformer Circuits, read "
        f"off the weights by qkov. Models: {nav}</p>"
        + (claims_section(claims) if claims else "")
        + phase_change_section(models)
        + "".join(model_section(name, r) for name, r in models.items())
        + f"<script>{VIEWER_JS}qkovViewers(document);</script></body></html>"
    )
