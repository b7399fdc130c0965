"""The README opens with exactly two commands (the main job and the tests), and its Python tour runs as
written, on a hand-built checkpoint in place of the main job's 2-layer model."""

from __future__ import annotations

import re
from pathlib import Path

import qkov

from served import explorer_checkpoint

README = Path(__file__).resolve().parent.parent / "README.md"


def test_the_readme_opens_with_the_main_job_and_the_tests():
    first = re.search(r"```bash\n(.*?)```", README.read_text(), re.S).group(1)
    commands = [line.split("#")[0].strip() for line in first.splitlines() if line.strip()]
    assert commands == ["make reproduce", "make test"]


def test_the_python_tour_runs_as_written(tmp_path):
    text = README.read_text()
    tour = text[text.index("## Using it from Python") :]
    code = re.search(r"```python\n(.*?)```", tour, re.S).group(1)
    folder, _ = explorer_checkpoint(tmp_path / "ckpt")
    assert 'qkov.load("runs/reproduce/2-layer")' in code
    namespace: dict = {}
    exec(code.replace('"runs/reproduce/2-layer"', repr(str(folder))), namespace)
    assert namespace["results"].repeated_tokens.induction_heads == ["L1H0"]  # the hand-built one
    assert (
        isinstance(namespace["copying"], qkov.Copying)
        and "<" in namespace["qkov"].view.attention(namespace["model"], "cat sat on the mat")._repr_html_()
    )
