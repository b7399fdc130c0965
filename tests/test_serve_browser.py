"""``qkov serve`` in a real headless Chromium: start the command on a free port, type a text with
hostile tokens, click the induction head, hover and click tokens, and check what the page draws
(attention, OV table, composition), that nothing hostile ran, and that no console error occurred;
with the user's data (``--tokens``, ``--targets``), pick a row and check its patterns, targets and
losses; a classifier's page reads classes and says why it has no loss. Screenshots are kept in
test-artifacts/."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch.nn.functional as F

import qkov

from conftest import CLASSIFIER, classifier_data, random_model, small_config
from pages import headless_chromium
from served import EVIL, ROWS, UNTARGETED, explorer_checkpoint, word_data

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
TEXT = f"cat sat on the mat {EVIL[0]} dog ran {EVIL[1]} cat sat on {EVIL[2]}"
WAIT_S = 60  # the server's start (importing torch) and each view, on a loaded 2-core machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serving(folder: Path, *options: str):
    """``qkov serve folder *options`` on a free port until the module is done (a generator for a
    fixture): its URL once it answers; stopped with Ctrl-C, which must be clean."""
    port = free_port()
    command = [sys.executable, "-m", "qkov.cli", "serve", str(folder), "--port", str(port), "--threads", "1"]
    command += options
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            urllib.request.urlopen(url + "api/model", timeout=2).read()
            break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                pytest.fail(f"qkov serve did not start: {process.communicate()}")
            time.sleep(0.2)
    yield url
    process.send_signal(signal.SIGINT)  # Ctrl-C: a clean stop, no traceback
    out, err = process.communicate(timeout=WAIT_S)
    assert process.returncode == 0 and out.endswith("qkov serve: stopped\n") and "Traceback" not in err, err


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder, _ = explorer_checkpoint(tmp_path_factory.mktemp("browser") / "induction")
    yield from serving(folder)


@pytest.fixture(scope="module")
def data_server(tmp_path_factory):
    """The same checkpoint served with the user's rows and targets; and the model, tokens, targets."""
    folder = tmp_path_factory.mktemp("browser-data")
    checkpoint, _ = explorer_checkpoint(folder / "induction")
    model = qkov.load(checkpoint).requires_grad_(False)
    tokens, targets, options = word_data(folder, model)
    for url in serving(checkpoint, *options):
        yield url, model, tokens, targets


@pytest.fixture(scope="module")
def classifier_server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("browser-classifier")
    qkov.save(random_model(CLASSIFIER, biases=True), folder / "ckpt")
    tokens, targets = classifier_data(batch=4)
    np.save(folder / "x.npy", tokens.numpy())
    np.save(folder / "y.npy", targets.numpy())
    yield from serving(folder / "ckpt", "--tokens", str(folder / "x.npy"), "--targets", str(folder / "y.npy"))


@pytest.fixture(scope="module")
def random_server(tmp_path_factory):
    """A 2-layer model with random weights: no head passes analyze's thresholds."""
    folder = tmp_path_factory.mktemp("browser-random")
    qkov.save(random_model(small_config(), seed=3), folder / "ckpt")
    yield from serving(folder / "ckpt")


@pytest.fixture(scope="module")
def browser():
    yield from headless_chromium("1300,2400")


def wait_for(driver, condition, what: str):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_S, poll_frequency=0.1).until(lambda d: condition(d), message=what)


def texts(driver, selector: str) -> list[str]:
    """The text of every element matching ``selector``, read in one step (the page redraws)."""
    script = "return Array.from(document.querySelectorAll(arguments[0])).map(e => e.textContent)"
    return driver.execute_script(script, selector)


def test_explore_the_induction_head_in_headless_chromium(server, browser):
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.common.action_chains import ActionChains

    driver = browser
    ARTIFACTS.mkdir(exist_ok=True)
    driver.get(server)
    wait_for(driver, lambda d: len(texts(d, "#head-buttons button")) == 4, "head buttons")
    wait_for(driver, lambda d: "tokens, mean loss" in texts(d, "#text-summary")[0], "the example text")
    box = driver.find_element("id", "text")
    box.clear()
    box.send_keys(TEXT)
    driver.find_element("id", "run").click()
    words = TEXT.split()
    wait_for(driver, lambda d: texts(d, "#tokens .tok") == words, "the typed text's tokens")
    next(b for b in driver.find_elements("css selector", "#head-buttons button") if b.text == "L1H0").click()
    wait_for(driver, lambda d: "Head L1H0" in d.find_element("id", "head-section").text, "head L1H0 selected")

    # The head scores arrive on their own and redraw the panels above the text: hover once they are in,
    # so that the page does not move between the pointer's aim and its arrival (a CI run lost that race).
    wait_for(driver, lambda d: "Induction head: L1H0" in texts(d, "#guide")[0], "the head scores")
    # hover the second "cat" (position 9): the induction head attends to the token after the first "cat"
    tokens = driver.find_elements("css selector", "#tokens .tok")
    ActionChains(driver).move_to_element(tokens[9]).perform()
    wait_for(
        driver, lambda d: "attends most" in texts(d, "#attention-status")[0], "the hovered token's status"
    )
    status = texts(driver, "#attention-status")[0]
    assert status.startswith('L1H0: token 9 "cat" attends most to 1 "sat"'), status
    alpha = re.search(r"background: rgba\(31, 119, 180, ([0-9.]+)\)", tokens[1].get_attribute("style"))
    assert float(alpha[1]) > 0.9  # drawn where it attends
    weight = re.search(r"L1H0 attention of 9 to it: ([0-9.]+)", tokens[1].get_attribute("title"))
    assert weight and float(weight[1]) == pytest.approx(float(alpha[1]), abs=4e-3)  # CSS alpha: 8 bits
    driver.save_screenshot(str(ARTIFACTS / "serve-attention.png"))

    tokens[9].click()  # its path expansion and, for L1H0, its OV and QK rows
    wait_for(driver, lambda d: len(d.find_elements("css selector", "#ov tr")) == 11, "the OV table")
    assert texts(driver, "#ov tr td:first-child")[0] == "cat"  # attending to "cat", L1H0 raises "cat"
    wait_for(driver, lambda d: "Path expansion at position 9" in d.find_element("id", "paths").text, "paths")
    assert texts(driver, "#paths tr td:first-child")[0] == "L1H0"  # the term that predicts "sat"
    driver.find_element("css selector", "#guide button").click()  # "why does L1H0 work?"
    wait_for(
        driver, lambda d: "K-composition induction check" in d.find_element("id", "pair").text, "the pair"
    )
    assert "= 1.00" in driver.find_element("id", "pair").text
    driver.save_screenshot(str(ARTIFACTS / "serve-head.png"))

    driver.find_element("css selector", "input[name=mode][value=loss]").click()  # colour by loss
    assert "loss of each position's prediction against its target" in texts(driver, "#attention-status")[0]
    driver.save_screenshot(str(ARTIFACTS / "serve-loss.png"))

    # hostile strings were shown as text, none ran
    assert driver.execute_script("return document.querySelectorAll('img, #tokens script').length") == 0
    assert EVIL[1] in texts(driver, "#tokens .tok")
    with pytest.raises(NoAlertPresentException):
        driver.switch_to.alert.text  # noqa: B018
    errors = [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
    assert errors == [], errors

    # the address holds the view: reloading it restores the head, the token and the tables
    url = driver.current_url
    assert "head=L1H0" in url and "pos=9" in url and "mode=loss" in url
    driver.get("about:blank")
    driver.get(url)
    wait_for(driver, lambda d: len(d.find_elements("css selector", "#ov tr")) == 11, "the restored OV table")
    assert texts(driver, "#ov tr td:first-child")[0] == "cat"
    assert driver.find_element("css selector", "#head-buttons button.active").text == "L1H0"


def test_the_running_server_refuses_the_longest_text_with_a_message(server):
    """A request line of 4001 two-byte characters, percent-encoded (24 KB): the server reads it
    and answers with the limit, rather than failing on the request's size."""
    from urllib.error import HTTPError
    from urllib.parse import quote

    for length, status in ((4000, 200), (4001, 400)):
        try:
            response = urllib.request.urlopen(server + "api/text?text=" + quote("é" * length), timeout=WAIT_S)
            assert status == 200 and response.status == 200
        except HTTPError as err:
            assert err.code == status == 400
            assert "longer than the limit of 4000" in err.read().decode()


def no_hostile_markup_ran(driver) -> None:
    """Nothing hostile became markup or ran, and the page logged no error."""
    from selenium.common.exceptions import NoAlertPresentException

    assert driver.execute_script("return document.querySelectorAll('img, #tokens script').length") == 0
    with pytest.raises(NoAlertPresentException):
        driver.switch_to.alert.text  # noqa: B018
    errors = [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
    assert errors == [], errors


def test_pick_a_row_of_the_users_data_in_headless_chromium(data_server, browser):
    from selenium.webdriver.common.action_chains import ActionChains

    url, model, tokens, targets = data_server
    driver = browser
    ARTIFACTS.mkdir(exist_ok=True)
    driver.get(url)
    wait_for(driver, lambda d: len(d.find_elements("css selector", "#data-rows tr")) == 4, "the data's rows")
    assert "rows.npy (3 x 11 tokens; targets targets.pt)" in texts(driver, "#data-summary")[0]
    assert EVIL[0] in texts(driver, "#data-rows .chip")  # a hostile token in the list, as text
    driver.find_elements("css selector", "#data-rows tr")[2].click()  # row 1
    wait_for(driver, lambda d: texts(d, "#tokens .tok") == ROWS[1].split(), "row 1's tokens")
    assert texts(driver, "#text-summary")[0].startswith("data row 1: 11 tokens, mean loss")

    # each position's target, prediction, loss and verdict, as the model computes them
    logits = model(tokens[1:2])[0]
    cells = driver.execute_script(
        "return Array.from(document.querySelectorAll('#positions tr')).slice(1)"
        ".map(r => Array.from(r.children).map(c => c.textContent))"
    )
    assert len(cells) == 11
    for pos, (_, token, target, predicted, loss, verdict) in enumerate(cells):
        assert token == ROWS[1].split()[pos]
        assert predicted == model.tokenizer.decode([int(logits[pos].argmax())])
        if pos in UNTARGETED or pos == 10:
            assert (target, loss, verdict) == ("no target", "—", "no target")
            continue
        want = float(F.cross_entropy(logits[pos], targets[1, pos]))
        assert target == ROWS[1].split()[pos + 1] and float(loss) == pytest.approx(want, abs=1.5e-3)
        assert verdict == ("✓" if int(logits[pos].argmax()) == int(targets[1, pos]) else "✗")

    # the induction head at the second "ran" (position 9) attends to the token after the first: "to"
    next(b for b in driver.find_elements("css selector", "#head-buttons button") if b.text == "L1H0").click()
    spans = driver.find_elements("css selector", "#tokens .tok")
    ActionChains(driver).move_to_element(spans[9]).perform()
    status = texts(driver, "#attention-status")[0]
    assert status.startswith('L1H0: token 9 "ran" attends most to 2 "to"'), status
    drawn = re.search(r"background: rgba?\(31, 119, 180(, [0-9.]+)?\)", spans[2].get_attribute("style"))
    assert drawn[1] is None or float(drawn[1][2:]) > 0.9  # the browser writes an alpha of 1 as rgb(...)
    spans[9].click()
    wait_for(driver, lambda d: "Path expansion at position 9" in d.find_element("id", "paths").text, "paths")
    assert 'sorted by its logit for the target "to"' in driver.find_element("id", "paths").text
    assert texts(driver, "#paths tr td:first-child")[0] == "L1H0"
    driver.save_screenshot(str(ARTIFACTS / "serve-data-row.png"))

    driver.find_element("css selector", "input[name=mode][value=loss]").click()
    assert "against its target" in texts(driver, "#attention-status")[0]
    dashed = driver.find_elements("css selector", "#tokens .tok.no-target")
    assert len(dashed) == len(UNTARGETED) + 1
    driver.save_screenshot(str(ARTIFACTS / "serve-data-loss.png"))
    assert EVIL[1] in texts(driver, "#tokens .tok")
    no_hostile_markup_ran(driver)

    # the address holds the row: reloading it shows row 1 again
    assert "row=1" in driver.current_url
    again = driver.current_url
    driver.get("about:blank")
    driver.get(again)
    wait_for(driver, lambda d: texts(d, "#text-summary")[0].startswith("data row 1:"), "the restored row")


def test_a_classifiers_page_reads_classes_and_says_why_there_is_no_loss(classifier_server, browser):
    driver = browser
    driver.get(classifier_server)
    wait_for(
        driver, lambda d: texts(d, "#no-loss")[0].startswith("no loss: the model's 2 outputs"), "no loss"
    )
    assert "typed text: 7 tokens, no loss" in texts(driver, "#text-summary")[0]  # the example cut to n_ctx
    assert "square token-to-token circuit" in texts(driver, "#guide")[0]
    assert set(texts(driver, "#positions tr td:nth-child(4)")) <= {"class 0", "class 1"}
    wait_for(driver, lambda d: len(d.find_elements("css selector", "#data-rows tr")) == 5, "the data's rows")
    driver.find_elements("css selector", "#data-rows tr")[1].click()  # row 0: a label at the last position
    wait_for(
        driver, lambda d: texts(d, "#text-summary")[0].startswith("data row 0: 7 tokens, mean loss"), "row 0"
    )
    targets = texts(driver, "#positions tr td:nth-child(3)")
    assert targets[:-1] == ["no target"] * 6 and targets[-1] in ("class 0", "class 1")
    driver.save_screenshot(str(ARTIFACTS / "serve-classifier.png"))
    assert driver.find_element("id", "error").text == ""
    no_hostile_markup_ran(driver)


def test_a_random_model_has_no_induction_head_to_explain(random_server, browser):
    """The guide says what analyze says: no head named below analyze's thresholds, the best one
    shown as such, and no "why does it work?" offer."""
    driver = browser
    driver.get(random_server)
    wait_for(driver, lambda d: "Induction head" in texts(d, "#guide")[0], "the head scores")
    guide = texts(driver, "#guide")[0]
    found = re.fullmatch(
        r"Previous-token head: none above 0\.50 \(best: L0H\d, 0\.\d\d\)\. "
        r"Induction head: none above 0\.30 \(best: L1H\d, 0\.\d\d\)\. ",
        guide,
    )
    assert found, guide
    assert driver.find_elements("css selector", "#guide button") == []
    driver.save_screenshot(str(ARTIFACTS / "serve-random-guide.png"))


def test_list_the_strongest_pairs_by_layer_and_compare_one_in_headless_chromium(server, browser, tmp_path):
    from selenium.webdriver.support.ui import Select

    driver = browser
    driver.get(server + "#")
    layers = "#pairs-writer-layer option"
    wait_for(driver, lambda d: texts(d, layers) == ["any", "0", "1"], "the layer filters")
    Select(driver.find_element("id", "pairs-writer-layer")).select_by_value("0")
    Select(driver.find_element("id", "pairs-reader-layer")).select_by_value("1")
    driver.find_element("id", "pairs-go").click()
    listed = "Pairs 1–4 of 4, strongest first"
    wait_for(driver, lambda d: listed in d.find_element("id", "pairs").text, "the pairs")
    scores = [float(s) for s in texts(driver, "#pairs tr td:nth-child(4)")]
    assert scores == sorted(scores, reverse=True)
    writer, reader = (texts(driver, f"#pairs tr td:nth-child({n})")[0] for n in (2, 3))
    _, model = explorer_checkpoint(tmp_path / "same")  # the served model; its strongest K pair first
    k = qkov.composition_scores(model, "K")[0, :, 1, :]
    strongest = divmod(int(k.argmax()), model.cfg.n_heads)
    assert (writer, reader) == (f"L0H{strongest[0]}", f"L1H{strongest[1]}")
    driver.find_elements("css selector", "#pairs tr.clickable")[0].click()
    check = "K-composition induction check"
    wait_for(driver, lambda d: check in d.find_element("id", "pair").text, "the pair")
    assert driver.find_element("id", "writer").get_attribute("value") == writer
    driver.save_screenshot(str(ARTIFACTS / "serve-pairs.png"))
    errors = [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
    assert errors == [], errors
