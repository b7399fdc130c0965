"""A notebook that imports qkov and calls the views, executed in a real IPython kernel (nbclient)
and exported as nbconvert writes a saved notebook, then opened in headless Chromium: every view
renders inline, hovering a token in one attention view paints where that head attends and leaves
the other view alone, and the page logs no error. Screenshots go to test-artifacts/."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pages import ARTIFACTS, headless_chromium

pytestmark = pytest.mark.slow
TESTS = Path(__file__).resolve().parent

CELLS = [
    f"import sys\nsys.path.insert(0, {str(TESTS)!r})\nimport torch\nimport qkov\n"
    "from handbuilt import induction_model\n"
    "model = induction_model(d_vocab=16, n_ctx=12)\ntokens = torch.tensor([3, 5, 7, 9] * 3)",
    "qkov.view.attention(model, tokens, 'a repeated sequence')",
    "strings = ['<b>x</b>', '<script>alert(1)</script>'] * 6\n"
    "qkov.view.attention(strings, qkov.frozen_patterns(model, tokens[None]), 'markup as tokens')",
    "model",
]


@pytest.fixture(scope="module")
def notebook_page(tmp_path_factory) -> Path:
    """The notebook executed in a kernel, exported to HTML (outputs as a front end shows them)."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nbconvert = pytest.importorskip("nbconvert")
    folder = tmp_path_factory.mktemp("notebook")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": folder}}
    ).execute()
    assert [o["output_type"] for c in nb.cells for o in c.outputs] == ["execute_result"] * 3
    body, _ = nbconvert.HTMLExporter(template_name="basic").from_notebook_node(nb)
    page = folder / "notebook.html"
    page.write_text(f"<!doctype html><html><head><meta charset='utf-8'></head><body>{body}</body></html>")
    return page


@pytest.fixture(scope="module")
def browser():
    yield from headless_chromium("1100,1400")


def _alphas(view) -> list[float]:
    styles = [span.get_attribute("style") for span in view.find_elements("css selector", ".tokens .tok")]
    found = [re.search(r"rgba?\(31, 119, 180(?:, ([0-9.]+))?\)", s) for s in styles]
    return [float(m[1] or 1) for m in found]  # the browser writes a weight of 1 as rgb(...)


def test_views_render_inline_with_hover_in_a_real_kernel_and_browser(notebook_page, browser):
    from selenium.webdriver.common.action_chains import ActionChains

    driver = browser
    ARTIFACTS.mkdir(exist_ok=True)
    driver.get(notebook_page.as_uri())
    views = driver.find_elements("css selector", ".qkov-view")
    assert len(views) == 3 and len({v.get_attribute("id") for v in views}) == 3
    first, second, model = views
    # each viewer initialised once, by its own output's script
    assert [b.text for b in first.find_elements("css selector", "button.head")] == [
        "L0H0",
        "L0H1",
        "L1H0",
        "L1H1",
    ]
    assert len(second.find_elements("css selector", "button.head")) == 4
    assert [t.text for t in second.find_elements("css selector", ".tokens .tok")][:2] == [
        "<b>x</b>", "<script>alert(1)</script>"
    ]  # fmt: skip
    assert "blocks.1.attn.W_O" in model.text

    next(b for b in first.find_elements("css selector", "button.head") if b.text == "L1H0").click()
    tokens = first.find_elements("css selector", ".tokens .tok")
    ActionChains(driver).move_to_element(tokens[8]).perform()  # the third "3"
    status = first.find_element("css selector", ".status").text
    assert re.fullmatch(
        r'L1H0: token 8 attends most to 5 "#5" \([01]\.\d\d\); hover a token for its weight', status
    )
    alphas = _alphas(first)
    assert alphas[5] > 0.9  # the induction head: the token after the latest earlier "3"
    title = tokens[5].get_attribute("title")  # the weight behind the colour, on hover
    assert re.fullmatch(r'5 "#5" · L1H0: attention from 8: [01]\.\d{3}', title)
    assert float(title.rsplit(": ", 1)[1]) == pytest.approx(alphas[5], abs=4e-3)
    assert all(a == 0 for a in alphas[9:])  # nothing after the destination
    assert all(a == 0 for a in _alphas(second))  # the other view is untouched
    driver.save_screenshot(str(ARTIFACTS / "notebook-hover.png"))

    ActionChains(driver).move_to_element(second.find_elements("css selector", ".tokens .tok")[3]).perform()
    assert _alphas(second)[2] > 0.9  # L0H0, the previous-token head, on the other view
    assert second.find_element("css selector", ".status").text.startswith("L0H0: token 3 attends most to 2")
    driver.execute_script("arguments[0].scrollIntoView()", second)
    driver.save_screenshot(str(ARTIFACTS / "notebook-second-view.png"))
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors
