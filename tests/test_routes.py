"""The explorer's routes (``serve/routes.py``): hostile strings travel as JSON data, and a job is
polled and cancelled through the app."""

from __future__ import annotations

from fastapi.testclient import TestClient

import qkov
from qkov.serve.jobs import Jobs

from served import EVIL, TEXT, explorer_checkpoint, get


def test_hostile_strings_travel_as_json_data(served):
    client, model = served
    text = f"cat {EVIL[0]} sat {EVIL[1]} on {EVIL[2]}"
    body = get(client, "/api/text", text=text)
    assert [t["str"] for t in body["tokens"]] == text.split()


def test_a_job_is_polled_and_cancelled_through_the_app(tmp_path):
    from qkov.serve.app import create_app
    from qkov.serve.explorer import Explorer

    folder, _ = explorer_checkpoint(tmp_path / "induction")
    jobs = Jobs(cache_bytes=2**20, workers=1, wait_s=0.0)  # every computation answers 202 first
    client = TestClient(create_app(Explorer(qkov.load(folder), "induction"), jobs))
    started = client.get("/api/heads")
    assert started.status_code == 202 and started.json()["state"] == "running"
    job = started.json()["job"]
    assert client.delete(f"/api/jobs/{job}").json()["state"] == "cancelled"
    polled = client.get(f"/api/jobs/{job}")
    assert polled.status_code == 409 and polled.json() == {"error": "the computation was cancelled"}
    answer = get(client, "/api/text", text=TEXT)  # a later query is computed as a job and polled
    assert len(answer["tokens"]) == len(TEXT.split())
    jobs.shutdown()
