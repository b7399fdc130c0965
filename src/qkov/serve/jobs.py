"""Computations on demand: each query computed once, its answer cached in a bounded LRU, and any
computation that outlasts a short wait reported as a job whose progress can be polled and which can
be cancelled.

A query is a key (its endpoint and parameters) and a function ``compute(progress) -> JSON-ready
value``. :meth:`Jobs.answer` returns the cached JSON bytes at once, or starts the computation (or
joins the one already running for the same key) and waits up to ``wait_s`` for it; a computation
still running then is answered with its job's state, to poll at ``/api/jobs/{id}`` or cancel.
Functions report progress with :meth:`Progress.step`, which is also where a cancelled job stops.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field

from qkov.errors import QkovError

MAX_JOBS = 256  # finished jobs kept for polling (their answers are small; the oldest are dropped)


class Cancelled(Exception):
    """Raised inside a computation whose job was cancelled."""


@dataclass
class Progress:
    """How far a computation is (``done`` of ``total`` steps of ``stage``); a cancelled job's
    computation stops at its next :meth:`step`."""

    done: int = 0
    total: int = 1
    stage: str = "queued"
    cancelled: threading.Event = field(default_factory=threading.Event)

    def step(self, done: int, total: int, stage: str) -> None:
        if self.cancelled.is_set():
            raise Cancelled
        self.done, self.total, self.stage = done, total, stage


@dataclass
class Job:
    id: str
    key: Hashable
    progress: Progress
    future: Future

    def describe(self) -> dict:
        state = "running"
        if self.future.cancelled() or self.progress.cancelled.is_set():
            state = "cancelled"
        elif self.future.done():
            state = "error" if self.future.exception() is not None else "done"
        out = {
            "job": self.id,
            "state": state,
            "done": self.progress.done,
            "total": self.progress.total,
            "stage": self.progress.stage,
        }
        if state == "error":
            out["error"] = str(self.future.exception())
        return out


class LRUCache:
    """Answers as JSON bytes, least recently used dropped first once ``max_bytes`` is exceeded."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items: OrderedDict[Hashable, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> bytes | None:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: Hashable, value: bytes) -> None:
        with self._lock:
            if key in self._items:
                self.bytes -= len(self._items.pop(key))
            if len(value) > self.max_bytes:
                return  # larger than the whole cache: answered, not kept
            self._items[key] = value
            self.bytes += len(value)
            while self.bytes > self.max_bytes:
                _, dropped = self._items.popitem(last=False)
                self.bytes -= len(dropped)

    def __len__(self) -> int:
        return len(self._items)


def encode(value: object) -> bytes:
    """JSON without NaN (undefined numbers must be null before this)."""
    return json.dumps(value, allow_nan=False, separators=(",", ":")).encode()


class Jobs:
    """Runs computations on ``workers`` threads, deduplicated by key, cached by key."""

    def __init__(self, cache_bytes: int, workers: int = 2, wait_s: float = 1.0) -> None:
        self.cache = LRUCache(cache_bytes)
        self.wait_s = wait_s
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="qkov-serve")
        self._jobs: OrderedDict[str, Job] = OrderedDict()
        self._running: dict[Hashable, Job] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def answer(
        self, key: Hashable, compute: Callable[[Progress], object], quick: bool = False
    ) -> tuple[int, bytes]:
        """``(200, answer)`` when done within the wait, else ``(202, the job's state)``. A
        :class:`QkovError` of the computation is raised here (the caller answers 400).

        ``quick`` computations (a millisecond or so: one row of a circuit) run in the caller's
        thread, so that they never queue behind long ones for a worker."""
        cached = self.cache.get(key)
        if cached is not None:
            return 200, cached
        if quick:
            body = encode(compute(Progress()))
            self.cache.put(key, body)
            return 200, body
        with self._lock:
            job = self._running.get(key)
            if job is None:
                job = self._start(key, compute)
        try:
            return 200, job.future.result(timeout=self.wait_s)
        except FutureTimeout:
            return 202, encode(job.describe())
        except (Cancelled, CancelledError):  # cancelled while running, or while still queued
            raise QkovError("the computation was cancelled") from None

    def _start(self, key: Hashable, compute: Callable[[Progress], object]) -> Job:
        progress = Progress()
        job_id = str(next(self._ids))

        def run() -> bytes:
            try:
                body = encode(compute(progress))
                self.cache.put(key, body)
                return body
            finally:
                with self._lock:
                    self._running.pop(key, None)

        job = Job(job_id, key, progress, self._pool.submit(run))
        self._running[key] = job
        self._jobs[job_id] = job
        while len(self._jobs) > MAX_JOBS:
            oldest = next(iter(self._jobs))
            if not self._jobs[oldest].future.done():
                break
            del self._jobs[oldest]
        return job

    def stats(self) -> dict:
        """The cache's size against its limit, and the computations running or queued."""
        with self._lock:
            running = len(self._running)
        return {
            "cache_entries": len(self.cache),
            "cache_bytes": self.cache.bytes,
            "cache_max_bytes": self.cache.max_bytes,
            "jobs_running": running,
        }

    def status(self, job_id: str) -> tuple[dict, bytes | None]:
        """A job's state, and its answer once done."""
        job = self._get(job_id)
        state = job.describe()
        body = job.future.result() if state["state"] == "done" else None
        return state, body

    def cancel(self, job_id: str) -> dict:
        job = self._get(job_id)
        job.progress.cancelled.set()
        job.future.cancel()
        with self._lock:
            if self._running.get(job.key) is job:
                del self._running[job.key]
        return job.describe()

    def _get(self, job_id: str) -> Job:
        with self._lock:
            job = self._jobs.get(job_id)
        if job is None:
            raise KeyError(job_id)
        return job

    def shutdown(self) -> None:
        for job in list(self._jobs.values()):
            job.progress.cancelled.set()
        self._pool.shutdown(wait=False, cancel_futures=True)
