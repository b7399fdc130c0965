"""The explorer's circuit view (``serve/circuit.py``): ``/api/circuit`` answers exactly what
``analyze`` writes as ``circuit``, a model it does not apply to is refused in one line, and in a
real headless Chromium the hand-built induction model's circuit is drawn and a click on its
K-composition edge shows that edge's attribution (screenshot in test-artifacts/)."""

from __future__ import annotations

import json
from dataclasses import asdict

from fastapi.testclient import TestClient

from qkov.analyze import run_steps
from qkov.serve.app import create_app
from qkov.serve.explorer import Explorer
from qkov.serve.jobs import Jobs
from test_serve_browser import ARTIFACTS, browser, server, texts, wait_for  # noqa: F401 (fixtures)

from handbuilt import skip_trigram_model
from served import get


def test_the_circuit_endpoint_answers_what_analyze_writes(served):
    client, model = served
    body = get(client, "/api/circuit")
    assert body == json.loads(json.dumps(asdict(run_steps(model, ["circuit"])["circuit"])))
    k = [e for e in body["edges"] if (e["writer"], e["reader"], e["kind"]) == ("L0H0", "L1H0", "K")]
    assert k and k[0]["name"] == "blocks.1.hook_k_input[:, :, 0]<-blocks.0.attn.hook_result[:, :, 0]"
    roles = {node["head"]: node["roles"] for node in body["nodes"]}
    assert "previous_token" in roles["L0H0"] and "induction" in roles["L1H0"]


def test_a_one_layer_model_is_refused_in_one_line():
    jobs = Jobs(cache_bytes=2**20, workers=1)
    client = TestClient(create_app(Explorer(skip_trigram_model([(3, 4, 5)]), "one"), jobs))
    response = client.get("/api/circuit")
    assert response.status_code == 400
    assert response.json() == {"error": "no circuit graph for this model: needs at least 2 layer(s)"}
    jobs.shutdown()


def test_click_an_edge_for_its_attribution_in_headless_chromium(server, browser):  # noqa: F811
    from selenium.webdriver.common.action_chains import ActionChains

    driver = browser
    ARTIFACTS.mkdir(exist_ok=True)
    driver.get(server)
    wait_for(driver, lambda d: len(texts(d, "#head-buttons button")) == 4, "head buttons")
    driver.find_element("id", "circuit-go").click()
    wait_for(driver, lambda d: d.find_elements("css selector", "#circuit line.circuit-edge"), "the circuit")
    assert "previous token" in driver.find_element("id", "circuit").text
    edges = driver.execute_script("return circuitGraph.edges")
    index = next(
        i for i, e in enumerate(edges) if (e["writer"], e["reader"], e["kind"]) == ("L0H0", "L1H0", "K")
    )
    driver.execute_script("arguments[0].scrollIntoView()", driver.find_element("id", "circuit-section"))
    # a click at the middle of the edge (a vertical line has no width for selenium's own click)
    svg = driver.find_element("css selector", "#circuit svg")
    target = driver.find_element("css selector", f'#circuit line.circuit-edge[data-edge="{index}"]')
    ends = {name: float(target.get_attribute(name)) for name in ("x1", "y1", "x2", "y2")}
    size = svg.size
    x, y = (
        (ends["x1"] + ends["x2"]) / 2 - size["width"] / 2,
        (ends["y1"] + ends["y2"]) / 2 - size["height"] / 2,
    )
    ActionChains(driver).move_to_element_with_offset(svg, round(x), round(y)).click().perform()
    wait_for(
        driver, lambda d: "L0H0 → L1H0 (K-composition)" in d.find_element("id", "circuit-edge").text, "edge"
    )
    shown = driver.find_element("id", "circuit-edge").text
    assert "blocks.1.hook_k_input[:, :, 0]<-blocks.0.attn.hook_result[:, :, 0]" in shown
    assert texts(driver, "#circuit-edge td:first-child") == ["L0H0", "L0H0.pos"]
    driver.save_screenshot(str(ARTIFACTS / "serve-circuit.png"))
    errors = [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
    assert errors == [], errors
