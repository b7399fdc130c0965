"""Names a person or a script reads: heads as ``L{layer}H{head}`` (``L1H4`` is head 4 of layer 1),
and activations in a cache by their TransformerLens hook names (``blocks.1.attn.hook_pattern``)."""

from __future__ import annotations

import re

from qkov.config import Config
from qkov.errors import QkovError

_HEAD = re.compile(r"L(\d+)H(\d+)")


def head_name(layer: int, head: int) -> str:
    return f"L{layer}H{head}"


ATTENTION_HOOKS = ("pattern", "result")
BLOCK_HOOKS = ("resid_pre", "resid_mid", "resid_post", "mlp_out")


def hook_name(layer: int, hook: str) -> str:
    """The cache key of an activation of ``layer``: ``"pattern"`` ``[batch, n_heads, dest, src]`` and
    ``"result"`` (every head's write, ``[batch, pos, n_heads, d_model]``) of its attention;
    ``"resid_pre"``, ``"resid_mid"`` (after attention, with an MLP) and ``"resid_post"``, the residual
    stream; ``"mlp_out"``, the MLP's write."""
    if hook in ATTENTION_HOOKS:
        return f"blocks.{layer}.attn.hook_{hook}"
    if hook in BLOCK_HOOKS:
        return f"blocks.{layer}.hook_{hook}"
    raise QkovError(f"no hook {hook!r}: expected one of {', '.join(ATTENTION_HOOKS + BLOCK_HOOKS)}")


def norm_name(layer: int | None, norm: str) -> str:
    """A LayerNorm's name: ``blocks.{layer}.ln1`` / ``ln2`` (before attention / the MLP), or
    ``ln_final`` (``layer`` None), as in TransformerLens; its weights are ``{name}.w`` and ``.b``."""
    return "ln_final" if layer is None else f"blocks.{layer}.{norm}"


def scale_hook(norm: str) -> str:
    """The cache key of a LayerNorm's per-position scale (``1 / sqrt(var + eps)``)."""
    return f"{norm}.hook_scale"


def parse_head(name: str, cfg: Config | None = None) -> tuple[int, int]:
    """``"L1H4"`` -> ``(1, 4)``, checked against the model's shape when ``cfg`` is given (so it also
    sorts head names in layer order)."""
    match = _HEAD.fullmatch(name)
    if match is None:
        raise QkovError(f"not a head name: {name!r} (expected L<layer>H<head>, e.g. L1H4)")
    layer, head = int(match[1]), int(match[2])
    if cfg is not None and (layer >= cfg.n_layers or head >= cfg.n_heads):
        raise QkovError(f"no head {name} in a model with {cfg.n_layers} layers of {cfg.n_heads} heads")
    return layer, head
