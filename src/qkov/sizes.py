"""The memory a config implies, checked before anything is allocated.

A config's shapes fix what building its model costs: every weight's ``d_model x ...`` entries, and
per layer the module objects themselves. :func:`check_model_size` refuses, in one line with the bytes
it would take, a config that would not fit (``n_layers`` 10^6, ``d_model`` 10^7), where building it
would take minutes and gigabytes before failing; each command that builds a model from a config
(``train``, ``import``, ``info``, ``analyze``, ``serve``) calls it first.

The budget is this machine's physical memory (``QKOV_MAX_BYTES`` sets another, in bytes), and at most
:data:`MAX_LAYERS` layers: more than any published transformer has, so the cap refuses only mistakes.
"""

from __future__ import annotations

import os

import torch

from qkov.config import Config
from qkov.errors import QkovError

MAX_LAYERS = 4096  # the deepest published transformers have a few hundred layers
LAYER_OVERHEAD_BYTES = 64 * 2**10  # a layer's modules and parameter objects, measured at about 40 KiB
BUDGET_VARIABLE = "QKOV_MAX_BYTES"
#: The largest weight the analyses take: the circuits multiply up to four weight matrices (the full QK
#: circuit ``W_E W_Q W_K^T W_E^T``), so weights of 3e38, finite in float32, give infinities and NaN.
#: A weight of 10^6 to the fourth power, times 10^4-wide sums thrice, stays within float32's 3.4e38.
MAX_WEIGHT = 1e6


def parameter_count(cfg: Config) -> int:
    """The number of weights of a model of ``cfg`` with its biases (``expected_shapes``' tensors)."""
    d, h, e, v = cfg.d_model, cfg.n_heads, cfg.d_head, cfg.d_vocab
    per_layer = 4 * h * d * e + 3 * h * e + d  # W_Q, W_K, W_V, W_O and their biases
    if cfg.has_mlp:
        per_layer += 2 * d * cfg.d_mlp + cfg.d_mlp + d  # W_in, W_out, b_in, b_out
    outside = v * d + d * cfg.d_out + cfg.d_out  # W_E, W_U, b_U
    if cfg.normalization == "LN":  # each LayerNorm's w and b
        per_layer += 2 * d * (2 if cfg.has_mlp else 1)
        outside += 2 * d
    if cfg.has_positions:
        outside += cfg.n_ctx * d
    return cfg.n_layers * per_layer + outside


def memory_budget() -> int:
    """Bytes a model may take: ``QKOV_MAX_BYTES`` when set, else this machine's physical memory."""
    given = os.environ.get(BUDGET_VARIABLE)
    if given is not None:
        try:
            budget = int(given)
        except ValueError:
            raise QkovError(f"{BUDGET_VARIABLE} must be a number of bytes, got {given!r}") from None
        if budget < 1:
            raise QkovError(f"{BUDGET_VARIABLE} must be a positive number of bytes, got {given!r}")
        return budget
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # no sysconf (Windows): no memory limit
        return 2**63


def human_bytes(n: float) -> str:
    """``n`` bytes in the largest binary unit that keeps a number of at least 1 (``1.5 GiB``)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def model_bytes(cfg: Config, bytes_per_weight: int = 4, copies: int = 1) -> int:
    """What building ``copies`` float copies of a model of ``cfg`` takes (training keeps four: the
    weights, their gradients and AdamW's two moments), with each layer's objects."""
    return copies * bytes_per_weight * parameter_count(cfg) + cfg.n_layers * LAYER_OVERHEAD_BYTES


def check_model_size(cfg: Config, what: str = "config", bytes_per_weight: int = 4, copies: int = 1) -> None:
    """One :class:`QkovError` line, before anything is allocated, for a config of more than
    :data:`MAX_LAYERS` layers or one whose model would not fit the memory budget."""
    if cfg.n_layers > MAX_LAYERS:
        raise QkovError(
            f"{what}: n_layers {cfg.n_layers:,} is more than {MAX_LAYERS:,}, the most qkov builds "
            f"(its layers alone would take {human_bytes(cfg.n_layers * LAYER_OVERHEAD_BYTES)})"
        )
    needed, budget = model_bytes(cfg, bytes_per_weight, copies), memory_budget()
    if needed > budget:
        kept = f"{copies} copies of " if copies > 1 else ""
        raise QkovError(
            f"{what}: a model of these shapes has {parameter_count(cfg):,} weights and would take "
            f"{human_bytes(needed)} ({kept}{bytes_per_weight}-byte floats), more than the "
            f"{human_bytes(budget)} available (set {BUDGET_VARIABLE} to change the limit)"
        )


def check_weight_magnitudes(tensors: dict[str, torch.Tensor], source: str) -> None:
    """One :class:`QkovError` line naming the first tensor with a value above :data:`MAX_WEIGHT` in
    magnitude (a damaged file, bits flipped in an exponent), before an analysis overflows on it."""
    for name, tensor in tensors.items():
        if tensor.numel() and tensor.dtype.is_floating_point and not tensor.is_meta:  # meta: no data (narrow)
            low, high = torch.aminmax(tensor.detach())  # no |tensor| made: Llama 3's W_U is 2 GiB
            largest = max(-float(low), float(high))
            if largest > MAX_WEIGHT:
                raise QkovError(
                    f"{source}: tensor {name} has a value of magnitude {largest:.3g}, "
                    f"above {MAX_WEIGHT:.0e}: "
                    "the circuits' products would overflow (a damaged file?)"
                )
