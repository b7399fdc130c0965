"""The explorer's app (``serve/app.py``): bad input gets a 4xx and a message, only its own assets are
served with safe headers, and its stats keep the cache within its limit."""

from __future__ import annotations

import pytest

from served import TEXT, get


@pytest.mark.parametrize(
    "url, params, message",
    [
        ("/api/text", {"text": " ".join(["cat"] * 25)}, "longer than the context (n_ctx=24)"),
        ("/api/text", {"text": "x" * 4001}, "longer than the limit of 4000"),
        ("/api/text", {"text": "   "}, "the text has no tokens"),
        ("/api/head/L2H0/ov", {"token": 4}, "no head L2H0"),
        ("/api/head/L0H7/qk", {"token": 4}, "no head L0H7"),
        ("/api/head/../../etc/ov", {"token": 4}, "Not Found"),
        ("/api/head/L1H0/ov", {"token": -1}, "token id -1 out of range"),
        ("/api/head/L1H0/qk", {"token": 10**6}, "token id 1000000 out of range"),
        ("/api/head/L1H0/ov", {"token": 4, "k": 10**6}, "k=1000000 out of range"),
        ("/api/head/L1H0/ov", {"token": 4, "k": 0}, "k=0 out of range"),
        ("/api/head/L1H0/ov", {"token": "cat"}, "token: Input should be a valid integer"),
        ("/api/paths", {"text": TEXT, "pos": 11}, "position 11 out of range"),
        (
            "/api/head/L0H0/skip-trigrams",
            {"source": 4, "destination": 5},
            "exactly one of source and destination",
        ),
        ("/api/pair", {"writer": "L1H0", "reader": "L0H0"}, "must be in an earlier layer"),
        (
            "/api/pair",
            {"writer": "L0H0", "reader": "L1H0", "kind": "X"},
            "kind: Input should be 'Q', 'K' or 'V'",
        ),
        ("/api/pair", {"writer": "L0H0"}, "reader: Field required"),
        ("/api/jobs/999999", {}, "no job '999999'"),
        ("/static/config.json", {}, "no asset 'config.json'"),
        ("/static/..%2Fconfig.json", {}, "Not Found"),
    ],
)
def test_bad_input_gets_a_4xx_with_a_message(served, url, params, message):
    client, _ = served
    response = client.get(url, params=params)
    assert 400 <= response.status_code < 500
    assert message in response.json()["error"]
    assert client.get("/api/model").status_code == 200  # and the server keeps serving


def test_only_its_own_assets_and_safe_headers(served):
    client, _ = served
    page = client.get("/")
    assert page.status_code == 200 and "script-src 'self'" in page.headers["content-security-policy"]
    assert page.headers["x-content-type-options"] == "nosniff"
    assert "http" not in page.text.replace("http://www.w3.org", "")  # nothing fetched from elsewhere
    assert "innerHTML" not in client.get("/static/app.js").text  # data goes in as text, never as HTML
    assert client.get("/api/model", headers={"host": "attacker.example"}).status_code == 400  # DNS rebinding
    assert client.get("/openapi.json").json()["paths"]["/api/head/{name}/ov"]["get"]["summary"]
    assert client.get("/docs").status_code == 404  # the interactive docs would load a CDN


def test_stats_show_the_cache_within_its_limit(served):
    client, _ = served
    get(client, "/api/head/L1H0/ov", token=4, k=3)  # a computed answer, kept in the cache
    stats = get(client, "/api/stats")
    assert stats["cache_entries"] >= 1 and 0 < stats["cache_bytes"] <= stats["cache_max_bytes"] == 256 * 2**20


@pytest.mark.parametrize("prefix", ["#²", "#١٢", "#" + "9" * 3999, "#-1", "#"])
def test_odd_number_prefixes_get_an_answer_not_a_server_error(served, prefix):
    """``#²`` passed str.isdigit and crashed int(): a 500 in plain text without the headers."""
    client, _ = served
    response = client.get("/api/vocab", params={"prefix": prefix})
    assert response.status_code < 500
    assert response.headers["x-content-type-options"] == "nosniff"
    assert set(response.json()) >= ({"matches"} if response.status_code == 200 else {"error"})
