"""Inline notebook views: every result, a model and path expansion's output show as the report
draws them, and :func:`attention` / :func:`heads` give the report's and the explorer's views in a
cell. The renderers are the report's (:mod:`qkov.report`); this package only wraps them for a
notebook (:mod:`qkov.view.frame`): self-contained (no network, no widgets, no kernel connection,
so the same output works in Jupyter, VS Code, Colab and in a saved notebook), one unique id per
output, token text escaped. ``View.save(path)`` writes any view as one HTML file.

Importing :mod:`qkov` installs the ``_repr_html_`` methods (:func:`qkov.view.reprs.install`).
"""

from qkov.view.attention import attention, heads, named_patterns
from qkov.view.frame import View
from qkov.view.reprs import install

install()

__all__ = ["View", "attention", "heads", "install", "named_patterns"]
