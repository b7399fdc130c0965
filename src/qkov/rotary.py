"""Rotary positions (Su et al., "RoFormer", 2021), as the open-weight models of today use them.

Each query and key is rotated, in ``rotary_dim / 2`` planes of its first ``rotary_dim`` dimensions,
by the angle ``p * f_i`` where ``p`` is its position and ``f_i`` the plane's frequency. With row
vectors (qkov's convention) a rotated query is ``q R(p)``, and ``R(i) R(j)^T = R(i - j)``: the score
between a query at ``i`` and a key at ``j`` is ``q R(i - j) k^T``. So a rotary head's QK circuit at
a *relative offset* ``d = i - j`` is ``W_Q R(d) W_K^T``, a fixed matrix of rank at most ``d_head``,
which is what :func:`qkov.circuits.qk_ov.full_qk_circuit` reads (the paper, with column vectors and
no rotation, writes ``W_Q^T W_K``; it has no positions in its QK circuit at all).

Two layouts pair the dimensions into planes: the half-split one of GPT-NeoX and Llama (dimension
``i`` with ``i + rotary_dim / 2``) and GPT-J's interleaved one (``2i`` with ``2i + 1``). The
frequencies are ``base^(-2i / rotary_dim)``, computed in float32 exactly as ``transformers`` computes
them (those are the numbers every checkpoint of these families has been run with), then rescaled by
a rule: ``linear`` (all divided by ``factor``) or Llama 3's by parts (low frequencies divided by
``factor``, high ones kept, the middle interpolated).
"""

from __future__ import annotations

import math

import torch
from jaxtyping import Float
from torch import Tensor

from qkov.config import Config


def rotary_dim(cfg: Config) -> int:
    """How many of each head's dimensions rotate (the rest carry no position)."""
    return cfg.rotary_dim if cfg.rotary_dim is not None else cfg.d_head


def frequencies(cfg: Config, layer: int = 0) -> Float[Tensor, " planes"]:
    """The angle per position of each rotation plane (float64 values of the float32 frequencies
    ``transformers`` computes); layers with a sliding window use ``rotary_local_base`` when set."""
    dim = rotary_dim(cfg)
    base = cfg.rotary_base
    if cfg.rotary_local_base is not None and cfg.window(layer) is not None:
        base = cfg.rotary_local_base
        scaling = None  # Gemma 3's local layers keep their own unscaled frequencies
    else:
        scaling = cfg.rotary_scaling
    inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim))
    if scaling is None:
        return inv.double()
    if scaling["rope_type"] == "linear":
        return (inv / scaling["factor"]).double()
    return _llama3(inv, scaling).double()


def _llama3(inv: Float[Tensor, " planes"], scaling: dict) -> Float[Tensor, " planes"]:
    """Llama 3's rule, in float32 as ``transformers`` applies it."""
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old / low, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / high) * ~(wavelen > old / low)
    return torch.where(medium, smoothed, scaled)


def plane_index(cfg: Config) -> tuple[Tensor, Tensor]:
    """The two dimensions of each plane: ``(i, i + rotary_dim / 2)`` (half-split) or ``(2i, 2i + 1)``
    (interleaved)."""
    half = rotary_dim(cfg) // 2
    planes = torch.arange(half)
    if cfg.rotary_interleaved:
        return 2 * planes, 2 * planes + 1
    return planes, planes + half


def rotate(
    x: Float[Tensor, "... pos d_head"], angles: Float[Tensor, "pos planes"], cfg: Config
) -> Float[Tensor, "... pos d_head"]:
    """``x`` rotated by ``angles`` in each plane: ``(a, b) -> (a cos - b sin, a sin + b cos)``."""
    first, second = plane_index(cfg)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    a, b = x[..., first], x[..., second]
    out = x.clone()
    out[..., first] = a * cos - b * sin
    out[..., second] = a * sin + b * cos
    return out


def rotation(
    cfg: Config, offset: float, layer: int = 0, dtype=torch.float64
) -> Float[Tensor, "d_head d_head"]:
    """``R(offset)``: the ``[d_head, d_head]`` matrix with ``(q R(i)) (k R(j))^T = q R(i - j) k^T``
    for ``offset = i - j`` (identity on the dimensions that do not rotate)."""
    eye = torch.eye(cfg.d_head, dtype=torch.float64)
    angles = offset * frequencies(cfg, layer)[None, :]
    return rotate(eye, angles, cfg).to(dtype)
