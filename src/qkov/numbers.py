"""Numbers as ``results.json`` holds them. JSON has no NaN: a number that is undefined (a head
whose OV circuit is zero has no copying score) is ``None`` in a result and ``null`` in the file."""

from __future__ import annotations

import math


def finite(x: float) -> float | None:
    """An undefined number (NaN, infinite) as ``None``, the JSON-safe form."""
    x = float(x)
    return x if math.isfinite(x) else None
