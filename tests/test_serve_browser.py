"""``qkov serve`` in a real headless Chromium: start the command on a free port, type a text with
hostile tokens, click the induction head, hover and click tokens, and check what the page draws
(attention, OV table, composition), that nothing hostile ran, and that no console error occurred.
Screenshots are kept in test-artifacts/."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from pages import headless_chromium
from served import EVIL, explorer_checkpoint

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
TEXT = f"cat sat on the mat {EVIL[0]} dog ran {EVIL[1]} cat sat on {EVIL[2]}"
WAIT_S = 60  # the server's start (importing torch) and each view, on a loaded 2-core machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder, _ = explorer_checkpoint(tmp_path_factory.mktemp("browser") / "induction")
    port = free_port()
    command = [sys.executable, "-m", "qkov.cli", "serve", str(folder), "--port", str(port), "--threads", "1"]
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

    # hover the second "cat" (position 9): the induction head attends to the token after the first "cat"
    tokens = driver.find_elements("css selector", "#tokens .tok")
    ActionChains(driver).move_to_element(tokens[9]).perform()
    status = driver.find_element("id", "attention-status").text
    assert status.startswith('L1H0: token 9 "cat" attends most to 1 "sat"'), status
    alpha = re.search(r"background: rgba\(31, 119, 180, ([0-9.]+)\)", tokens[1].get_attribute("style"))
    assert float(alpha[1]) > 0.9  # drawn where it attends
    driver.save_screenshot(str(ARTIFACTS / "serve-attention.png"))

    tokens[9].click()  # its path expansion and, for L1H0, its OV and QK rows
    wait_for(driver, lambda d: len(d.find_elements("css selector", "#ov tr")) == 11, "the OV table")
    assert texts(driver, "#ov tr td:first-child")[0] == "cat"  # attending to "cat", L1H0 raises "cat"
    wait_for(driver, lambda d: "Path expansion at position 9" in d.find_element("id", "paths").text, "paths")
    assert texts(driver, "#paths tr td:first-child")[0] == "L1H0"  # the term that predicts "sat"
    wait_for(driver, lambda d: "Induction head: L1H0" in texts(d, "#guide")[0], "the head scores")
    driver.find_element("css selector", "#guide button").click()  # "why does L1H0 work?"
    wait_for(
        driver, lambda d: "K-composition induction check" in d.find_element("id", "pair").text, "the pair"
    )
    assert "= 1.00" in driver.find_element("id", "pair").text
    driver.save_screenshot(str(ARTIFACTS / "serve-head.png"))

    driver.find_element("css selector", "input[name=mode][value=loss]").click()  # colour by loss
    assert "loss of predicting each token" in texts(driver, "#attention-status")[0]
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
