"""Sphinx configuration of qkov's documentation site (``make docs``).

Sphinx, not MkDocs: qkov's docstrings are reStructuredText (``:func:``, ``:class:`` and
``:mod:`` cross-references, ``literal`` spans), which autodoc renders and links as written, and
MyST-NB executes the tutorials, kept as jupytext percent files, in a real kernel at every build
(``nb_execution_mode = "force"``) and fails the build on the first error. ``make docs`` builds with
``-W``: every warning is an error. Nothing is fetched when the site is built or read (Furo uses
system fonts; no math, so no MathJax).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "_ext"))

project = "qkov"
author = "qkov contributors"
extensions = ["myst_nb", "sphinx.ext.autodoc", "sphinx.ext.viewcode", "results_keys"]
html_theme = "furo"
html_title = "qkov"
exclude_patterns = ["_build", "conf.py", "_ext", "**/.ipynb_checkpoints", "tutorials/_*"]
source_suffix = {".md": "myst-nb", ".py": "myst-nb"}

# The tutorials: jupytext percent files, executed at every build, an error failing it.
nb_custom_formats = {".py": ["jupytext.reads", {"fmt": "py:percent"}]}
nb_execution_mode = "force"
nb_execution_raise_on_error = True
nb_execution_timeout = 300
nb_execution_show_tb = True
nb_merge_streams = True
nb_mime_priority_overrides = [("html", "text/html", 0)]

autodoc_member_order = "bysource"
autodoc_typehints = "signature"  # jaxtyping shapes in the signatures, as the code writes them
autodoc_default_options = {"members": True, "undoc-members": False}
myst_heading_anchors = 3
suppress_warnings = ["myst.header"]
