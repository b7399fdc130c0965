"""Writing a JSON Lines corpus file, plain or compressed by its suffix (``.gz``, ``.zst``), as a user
would hand one to ``--corpus``."""

from __future__ import annotations

import gzip
import json

import zstandard


def write_jsonl(path, rows):
    data = "".join(json.dumps(row) + "\n" for row in rows).encode()
    if path.name.endswith(".gz"):
        data = gzip.compress(data)
    elif path.name.endswith(".zst"):
        data = zstandard.ZstdCompressor().compress(data)
    path.write_bytes(data)
    return path
