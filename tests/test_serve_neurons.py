"""The explorer's neuron view: ``/api/neuron`` on the hand-built neuron model (a planted key and
value, hostile token strings) answers what was planted and refuses bad input in one line; and the
page, in a real headless Chromium, draws the neuron's tokens as text, restores the view from its
address, and logs no error. Screenshots are kept in test-artifacts/."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

import qkov
from qkov.serve import build_app
from test_serve_browser import ARTIFACTS, serving, texts, wait_for

from handbuilt import neuron_model
from pages import headless_chromium
from served import EVIL, WORDS, get, word_tokenizer

VOCAB = ["[UNK]", *EVIL, *WORDS]  # token 5 "sat" excites neuron 2; it raises 7 "the", lowers 3 "</script>"


def neuron_checkpoint(folder):
    return qkov.save(neuron_model(d_vocab=len(VOCAB), n_ctx=32), folder, word_tokenizer(VOCAB))


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    app, jobs = build_app(neuron_checkpoint(tmp_path_factory.mktemp("neurons") / "neuron"))
    with TestClient(app, base_url="http://127.0.0.1") as client:
        yield client
    jobs.shutdown()


def test_the_neuron_view_reads_the_planted_key_and_value(client):
    body = get(client, "/api/neuron", layer=0, neuron=2, k=3)
    assert [(t["id"], t["str"], t["value"]) for t in body["excited_by"]][:2] == [
        (5, "sat", 3.0),
        (1, EVIL[0], 0.75),
    ]
    assert (body["raised"][0]["id"], body["raised"][0]["value"]) == (7, 3.0)
    assert (body["lowered"][0]["str"], body["lowered"][0]["value"]) == (EVIL[2], -2.0)
    assert body["logit_effect"] == pytest.approx((13 / len(VOCAB)) ** 0.5) and body["rank"] == 1
    assert body["top_neurons"][0] == {"neuron": 2, "logit_effect": body["logit_effect"]}
    other = get(client, "/api/neuron", layer=0, neuron=0, k=2)
    assert other["logit_effect"] == 0.0 and all(t["value"] == 0.0 for t in other["excited_by"])


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"layer": 1, "neuron": 0}, "layer 1 out of range: the model has layers 0 to 0"),
        ({"layer": 0, "neuron": 4}, "neuron 4 out of range: each MLP has neurons 0 to 3"),
        ({"layer": 0, "neuron": 0, "k": 0}, "k=0 out of range"),
    ],
)
def test_the_neuron_view_refuses_bad_input_in_one_line(client, params, message):
    response = client.get("/api/neuron", params=params)
    assert response.status_code == 400 and response.json()["error"].startswith(message)


def test_an_attention_only_model_has_no_neuron_view(served):
    client, _ = served
    response = client.get("/api/neuron", params={"layer": 0, "neuron": 0})
    assert response.status_code == 400
    assert response.json() == {"error": "the model has no MLPs (attention-only): it has no neurons"}


@pytest.fixture(scope="module")
def browser():
    yield from headless_chromium("1300,2400")


@pytest.fixture(scope="module")
def neuron_server(tmp_path_factory):
    yield from serving(neuron_checkpoint(tmp_path_factory.mktemp("browser") / "neuron"))


@pytest.mark.slow
def test_the_neuron_view_in_headless_chromium(neuron_server, browser):
    from selenium.common.exceptions import NoAlertPresentException

    driver = browser
    ARTIFACTS.mkdir(exist_ok=True)
    driver.get(neuron_server + "#text=cat%20sat%20on%20the%20mat")
    wait_for(driver, lambda d: d.find_element("id", "neuron-section").is_displayed(), "the neuron section")
    assert texts(driver, "#neuron-layer option") == ["L0"]
    box = driver.find_element("id", "neuron-id")
    box.clear()
    box.send_keys("2")
    driver.find_element("id", "neuron-go").click()
    wait_for(driver, lambda d: len(d.find_elements("css selector", "#neuron tr")) == 11, "the neuron table")
    first = texts(driver, "#neuron tr:nth-child(2) td")
    assert first == ["sat", "3.00", "the", "3.00", EVIL[2], "-2.00"]
    assert texts(driver, "#neuron tr:nth-child(3) td")[0] == EVIL[0]  # hostile markup shown as text
    assert "L0N2: direct logit effect" in texts(driver, "#neuron h3")[0]
    assert texts(driver, "#neuron-top button")[0].startswith("N2 ")
    driver.execute_script("document.getElementById('neuron-section').scrollIntoView()")
    driver.save_screenshot(str(ARTIFACTS / "serve-neuron.png"))
    assert driver.execute_script("return document.querySelectorAll('img').length") == 0
    with pytest.raises(NoAlertPresentException):
        driver.switch_to.alert.text  # noqa: B018
    assert [e for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []

    url = driver.current_url  # the address holds the view
    assert "nlayer=0" in url and "neuron=2" in url
    driver.get("about:blank")
    driver.get(url)
    wait_for(driver, lambda d: len(d.find_elements("css selector", "#neuron tr")) == 11, "the restored table")
    assert texts(driver, "#neuron tr:nth-child(2) td")[0] == "sat"
