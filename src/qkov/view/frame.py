"""One inline output: an HTML fragment from the report's renderers, wrapped so that it works in any
notebook front end (Jupyter, VS Code, Colab) without widgets or a kernel connection, and in a file
of its own.

The wrapper is a ``<div class="qkov-view" id="qkov-…">`` with a fresh id per output, the report's
stylesheet scoped to ``.qkov-view`` (so it styles neither the notebook nor other outputs), and the
report's attention-viewer script run on that element alone (so two views in one notebook never
initialise each other's). Nothing is fetched: the CSS, the SVG and the script are inline.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

from qkov.io import atomic_write_text

# The page's ``body`` rule, for an element inside someone else's page: white (readable under dark
# notebook themes too) and no page margins.
ROOT_CSS = (
    ".qkov-view { font-family: system-ui, sans-serif; color: #222; background: white; "
    "padding: .5em; max-width: 100%; overflow-x: auto; }"
)


def scoped_css(css: str) -> str:
    """The report's stylesheet with every selector limited to ``.qkov-view`` (``body`` dropped:
    :data:`ROOT_CSS` takes its place)."""
    rules = []
    for selectors, body in re.findall(r"([^{}]+)\{([^}]*)\}", css):
        names = [s.strip() for s in selectors.split(",") if s.strip() and s.strip() != "body"]
        if names:
            rules.append(", ".join(f".qkov-view {name}" for name in names) + " {" + body + "}")
    return ROOT_CSS + "\n" + "\n".join(rules)


class View:
    """An inline view: shown by Jupyter through ``_repr_html_``; :meth:`save` writes it as one
    self-contained HTML file. ``html`` is the fragment (the report's markup, escaped there)."""

    def __init__(self, html: str, title: str = "qkov view") -> None:
        self.html = html
        self.title = title

    def _repr_html_(self) -> str:
        return wrap(self.html)

    def page(self) -> str:
        """The whole HTML document: the view and nothing else (no network needed to open it)."""
        from qkov.report.svg import esc

        return (
            "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>{esc(self.title)}</title></head><body>{wrap(self.html)}</body></html>"
        )

    def save(self, path: str | Path) -> Path:
        """Write :meth:`page` to ``path`` (atomically) and return the path."""
        atomic_write_text(path, self.page())
        return Path(path)


def wrap(fragment: str) -> str:
    """``fragment`` in its own ``.qkov-view`` element with a unique id, the scoped stylesheet, and
    the attention viewer's script run on that element (only when it has a viewer)."""
    from qkov.report.page import CSS, VIEWER_JS

    root = f"qkov-{uuid.uuid4().hex}"
    script = ""
    if "attention-viewer" in fragment:
        run = f"qkovViewers(document.getElementById('{root}'));"
        script = f"<script>(function () {{{VIEWER_JS}{run}}})();</script>"
    return f'<div class="qkov-view" id="{root}"><style>{scoped_css(CSS)}</style>{fragment}{script}</div>'
