"""Head names as a person reads them: ``L{layer}H{head}`` (``L1H4`` is head 4 of layer 1)."""

from __future__ import annotations

import re

from qkov.config import Config
from qkov.errors import QkovError

_HEAD = re.compile(r"L(\d+)H(\d+)")


def head_name(layer: int, head: int) -> str:
    return f"L{layer}H{head}"


def head_names(cfg: Config) -> list[str]:
    """Every head of a model, layer by layer."""
    return [head_name(layer, head) for layer in range(cfg.n_layers) for head in range(cfg.n_heads)]


def parse_head(name: str, cfg: Config) -> tuple[int, int]:
    """``"L1H4"`` -> ``(1, 4)``, checked against the model's shape."""
    match = _HEAD.fullmatch(name)
    if match is None:
        raise QkovError(f"not a head name: {name!r} (expected L<layer>H<head>, e.g. L1H4)")
    layer, head = int(match[1]), int(match[2])
    if layer >= cfg.n_layers or head >= cfg.n_heads:
        raise QkovError(f"no head {name} in a model with {cfg.n_layers} layers of {cfg.n_heads} heads")
    return layer, head
