"""Peak resident memory of a call, sampled from /proc in a background thread (Linux)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def measure(fn: Callable[[], Any]) -> tuple[Any, float, int]:
    """``(result, seconds, peak extra bytes)`` of ``fn()``: the highest RSS seen while it ran,
    above the RSS before it started, sampled every millisecond."""
    start_rss = rss_bytes()
    peak = start_rss
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, rss_bytes())
            time.sleep(0.001)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    started = time.perf_counter()
    try:
        result = fn()
    finally:
        elapsed = time.perf_counter() - started
        done.set()
        thread.join()
    peak = max(peak, rss_bytes())
    return result, elapsed, peak - start_rss
