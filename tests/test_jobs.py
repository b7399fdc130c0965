"""The explorer's jobs (``serve/jobs.py``): a bounded least-recently-used cache, and long computations
that report progress and can be cancelled."""

from __future__ import annotations

import time

from qkov.serve.jobs import Jobs, LRUCache


def test_the_cache_is_bounded_and_least_recently_used_goes_first():
    cache = LRUCache(max_bytes=10)
    cache.put("a", b"1234")
    cache.put("b", b"5678")
    assert cache.get("a") == b"1234"  # now b is the least recently used
    cache.put("c", b"90ab")
    assert cache.get("b") is None and cache.get("a") == b"1234" and cache.bytes == 8
    cache.put("huge", b"x" * 11)  # larger than the whole cache: not kept
    assert cache.get("huge") is None and len(cache) == 2


def test_a_long_computation_reports_progress_and_can_be_cancelled():
    jobs = Jobs(cache_bytes=2**20, workers=1, wait_s=0.05)
    started = []

    def slow(progress):
        for i in range(1000):
            progress.step(i, 1000, "counting")
            started.append(i)
            time.sleep(0.01)
        return {"done": True}

    status, body = jobs.answer(("slow",), slow)
    assert status == 202
    job_id = __import__("json").loads(body)["job"]
    time.sleep(0.2)
    state, answer = jobs.status(job_id)
    assert (
        state["state"] == "running" and state["done"] > 0 and state["stage"] == "counting" and answer is None
    )
    assert jobs.cancel(job_id)["state"] == "cancelled"
    time.sleep(0.1)
    seen = len(started)
    time.sleep(0.1)
    assert len(started) == seen < 1000  # it stopped
    status, _ = jobs.answer(("fast",), lambda progress: [1, 2])
    assert status == 200 and jobs.answer(("fast",), lambda progress: 1 / 0) == (200, b"[1,2]")  # cached
    jobs.shutdown()
