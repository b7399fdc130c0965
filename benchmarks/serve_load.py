"""``qkov serve`` under load: 8 concurrent clients send mixed queries for 30 s to a server on
loopback (a separate process, started by ``qkov serve``), against a 2-layer model at the 2-layer
recipe's shapes (random weights, a byte-level BPE tokenizer trained on a part of the standard
library) or a given checkpoint. Prints p50/p95 latency per endpoint (a query that becomes a job is
timed until its answer, polling included), the errors, and the server's resident memory over the
run (the answer cache is bounded by ``--cache-mb``).

    flock /tmp/qkov-heavy.lock python benchmarks/serve_load.py
    flock /tmp/qkov-heavy.lock python benchmarks/serve_load.py --checkpoint runs/reproduce/2-layer
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

import qkov
from qkov.data.corpus import stdlib_root
from qkov.data.sources import CorpusFiles
from qkov.data.tokenizer import train_tokenizer
from qkov.recipes import recipe

TEXTS = 64  # distinct texts: repeated queries hit the cache, as a person going back and forth does
WEIGHTS = {  # how often each kind of query is sent
    "text": 25,
    "paths": 15,
    "ov": 15,
    "qk": 10,
    "skip-trigrams source": 6,
    "skip-trigrams destination": 2,
    "heads": 5,
    "pair": 10,
    "vocab": 12,
}


def build_checkpoint(folder: Path) -> Path:
    """A 2-layer model at the 2-layer recipe's shapes, random weights, with a tokenizer."""
    texts = [d.text for d in CorpusFiles.find([str(stdlib_root() / "email")]).documents()]
    r = recipe(2)
    tokenizer = train_tokenizer(texts, r.vocab_size)
    cfg, _ = r.configs(tokenizer.get_vocab_size())
    return qkov.save(qkov.AttnOnlyTransformer(cfg), folder, tokenizer)


def sample_texts(model: qkov.AttnOnlyTransformer, rng: random.Random) -> list[str]:
    """Windows of the standard library's source that fit the context."""
    documents = [d.text for d in CorpusFiles.find([str(stdlib_root() / "json")]).documents()]
    texts = []
    while len(texts) < TEXTS:
        doc = rng.choice(documents)
        start = rng.randrange(max(1, len(doc) - 400))
        text = doc[start : start + rng.randint(40, 300)]
        if 2 <= len(model.tokenizer.encode(text).ids) <= model.cfg.n_ctx:
            texts.append(text)
    return texts


def query(kind: str, model: qkov.AttnOnlyTransformer, texts: list[str], rng: random.Random) -> str:
    cfg = model.cfg
    head = f"L{rng.randrange(cfg.n_layers)}H{rng.randrange(cfg.n_heads)}"
    token, k = rng.randrange(cfg.d_vocab), rng.choice((5, 10, 20))
    text = rng.choice(texts)
    params: dict = {
        "text": ("/api/text", {"text": text}),
        "paths": (
            "/api/paths",
            {"text": text, "pos": rng.randrange(len(model.tokenizer.encode(text).ids)), "k": k},
        ),
        "ov": (f"/api/head/{head}/ov", {"token": token, "k": k}),
        "qk": (f"/api/head/{head}/qk", {"token": token, "k": k}),
        "skip-trigrams source": (f"/api/head/{head}/skip-trigrams", {"source": token, "k": k}),
        "skip-trigrams destination": (f"/api/head/{head}/skip-trigrams", {"destination": token, "k": k}),
        "heads": ("/api/heads", {}),
        "pair": (
            "/api/pair",
            {
                "writer": f"L0H{rng.randrange(cfg.n_heads)}",
                "reader": f"L1H{rng.randrange(cfg.n_heads)}",
                "kind": rng.choice("QKV"),
                "k": k,
            },
        ),  # fmt: skip
        "vocab": ("/api/vocab", {"prefix": model.tokenizer.decode([token])[:2], "k": k}),
    }
    path, values = params[kind]
    return path + ("?" + urllib.parse.urlencode(values) if values else "")


def fetch(conn: http.client.HTTPConnection, url: str) -> int:
    """GET ``url``, following a job to its answer; the final status."""
    conn.request("GET", url)
    response = conn.getresponse()
    body = response.read()
    while response.status == 202:
        time.sleep(0.05)
        conn.request("GET", f"/api/jobs/{json.loads(body)['job']}")
        response = conn.getresponse()
        body = response.read()
    return response.status


def client(port, model, texts, seed, stop, timings, errors) -> None:
    rng = random.Random(seed)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    kinds, weights = list(WEIGHTS), list(WEIGHTS.values())
    while not stop.is_set():
        kind = rng.choices(kinds, weights)[0]
        url = query(kind, model, texts, rng)
        start = time.perf_counter()
        status = fetch(conn, url)
        timings.setdefault(kind, []).append(time.perf_counter() - start)
        if status != 200:
            errors.append((status, url))


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", help="default: a random 2-layer model at the recipe's shapes")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--cache-mb", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2, help="the server's CPU threads")
    parser.add_argument("--workers", type=int, default=2, help="the server's computations at once")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = Path(args.checkpoint) if args.checkpoint else build_checkpoint(Path(tmp) / "2-layer")
        model = qkov.load(checkpoint)
        texts = sample_texts(model, random.Random(0))
        port = free_port()
        command = [sys.executable, "-m", "qkov.cli", "serve", str(checkpoint), "--port", str(port)]
        command += [
            "--cache-mb",
            str(args.cache_mb),
            "--threads",
            str(args.threads),
            "--workers",
            str(args.workers),
        ]
        server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        try:
            started = time.perf_counter()
            print(server.stdout.readline().strip())
            while True:
                try:
                    http.client.HTTPConnection("127.0.0.1", port, timeout=5).request("GET", "/api/model")
                    break
                except OSError:
                    time.sleep(0.1)
            conn = http.client.HTTPConnection("127.0.0.1", port)
            fetch(conn, "/")
            print(f"first page answered {time.perf_counter() - started:.1f} s after start")
            run(args, model, texts, port, server.pid)
        finally:
            server.terminate()
            server.wait()


def run(args, model, texts, port, pid) -> None:
    cfg = model.cfg
    print(
        f"model: {cfg.n_layers} layers x {cfg.n_heads} heads, d_model {cfg.d_model}, d_vocab {cfg.d_vocab}, "
        f"n_ctx {cfg.n_ctx}; {args.clients} clients for {args.seconds:.0f} s; cache {args.cache_mb} MiB, "
        f"{args.workers} workers, {args.threads} threads"
    )
    stop, timings, errors = threading.Event(), {}, []
    threads = [
        threading.Thread(target=client, args=(port, model, texts, seed, stop, timings, errors))
        for seed in range(args.clients)
    ]
    memory = [(0.0, rss_mib(pid))]
    start = time.perf_counter()
    for t in threads:
        t.start()
    while time.perf_counter() - start < args.seconds:
        time.sleep(1.0)
        memory.append((time.perf_counter() - start, rss_mib(pid)))
    stop.set()
    for t in threads:
        t.join()
    total = sum(len(v) for v in timings.values())
    print(f"{total} queries in {args.seconds:.0f} s ({total / args.seconds:.0f}/s), {len(errors)} errors")
    print(f"{'endpoint':28s} {'n':>6s} {'p50 ms':>9s} {'p95 ms':>9s} {'max ms':>9s}")
    for kind in WEIGHTS:
        times = sorted(timings.get(kind, []))
        if not times:
            continue
        p50, p95 = statistics.median(times), times[min(len(times) - 1, int(0.95 * len(times)))]
        print(f"{kind:28s} {len(times):6d} {1e3 * p50:9.1f} {1e3 * p95:9.1f} {1e3 * times[-1]:9.1f}")
    conn = http.client.HTTPConnection("127.0.0.1", port)
    conn.request("GET", "/api/stats")
    stats = json.loads(conn.getresponse().read())
    print(
        f"answer cache: {stats['cache_entries']} answers, {stats['cache_bytes'] / 2**20:.1f} MiB "
        f"of {stats['cache_max_bytes'] / 2**20:.0f} MiB"
    )
    samples = ", ".join(f"{m:.0f}" for at, m in memory if round(at) % 5 == 0)
    print(f"server RSS every 5 s (MiB): {samples}; peak {max(m for _, m in memory):.0f}")
    for status, url in errors[:5]:
        print(f"error {status}: {url[:120]}")


if __name__ == "__main__":
    main()
