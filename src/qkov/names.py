"""Names a person or a script reads: heads as ``L{layer}H{head}`` (``L1H4`` is head 4 of layer 1),
and activations in a cache by their TransformerLens hook names (``blocks.1.attn.hook_pattern``)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from qkov.config import Config
from qkov.errors import QkovError

_HEAD = re.compile(r"L(\d+)H(\d+)")


def head_name(layer: int, head: int) -> str:
    return f"L{layer}H{head}"


ATTENTION_HOOKS = ("pattern", "z", "result")
BLOCK_HOOKS = ("resid_pre", "attn_out", "resid_mid", "resid_post", "mlp_out")


def hook_name(layer: int, hook: str) -> str:
    """The cache key of an activation of ``layer``: ``"pattern"`` ``[batch, n_heads, dest, src]``,
    ``"z"`` (every head's attention-weighted values, ``[batch, pos, n_heads, d_head]``) and ``"result"``
    (every head's write, ``[batch, pos, n_heads, d_model]``) of its attention; ``"attn_out"``, the
    layer's whole write (the heads' plus ``b_O``); ``"resid_pre"``, ``"resid_mid"`` (after attention,
    with an MLP) and ``"resid_post"``, the residual stream; ``"mlp_out"``, the MLP's write."""
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


def head_names(heads: str | Sequence[str]) -> list[str]:
    """Head names where a list of them is expected: one name (``"L1H1"``) is that one head, not
    its characters."""
    return [heads] if isinstance(heads, str) else list(heads)


def hook_points(cfg: Config) -> list[str]:
    """Every activation a run of a model of ``cfg`` caches and lets a hook replace, in the order the
    forward reaches them (section "Residual Stream": the embedding, then each block's reads and
    writes, then the final norm's scale)."""
    names = ["hook_embed"] + (["hook_pos_embed"] if cfg.has_positions else [])
    for layer in range(cfg.n_layers):
        names.append(hook_name(layer, "resid_pre"))
        if cfg.has_layer_norm and cfg.pre_norms:
            names.append(scale_hook(norm_name(layer, "ln1")))
        names += [hook_name(layer, "pattern"), hook_name(layer, "z")]
        if cfg.has_layer_norm and cfg.post_norms:
            names.append(scale_hook(norm_name(layer, "ln1_post")))
        names += [hook_name(layer, "result"), hook_name(layer, "attn_out")]
        if cfg.has_mlp:
            names.append(hook_name(layer, "resid_mid"))
            if cfg.has_layer_norm and cfg.pre_norms:
                names.append(scale_hook(norm_name(layer, "ln2")))
            if cfg.has_layer_norm and cfg.post_norms:
                names.append(scale_hook(norm_name(layer, "ln2_post")))
            names.append(hook_name(layer, "mlp_out"))
        names.append(hook_name(layer, "resid_post"))
    return names + ([scale_hook(norm_name(None, "ln_final"))] if cfg.has_layer_norm else [])


_SHORT = re.compile(r"([a-z]+)(\d+)(.*)")
_ACT_ALIASES = {"attn": "pattern", "attn_logits": "attn_scores", "key": "k", "query": "q", "value": "v"}
_ACT_ALIASES |= {"mlp_pre": "pre", "mlp_mid": "mid", "mlp_post": "post"}
_SUBLAYER_ALIASES = {"a": "attn", "attention": "attn", "m": "mlp", "b": "", "block": "", "blocks": ""}
_IN_ATTENTION = {"q", "k", "v", "z", "rot_q", "rot_k", "result", "pattern", "attn_scores"}
_IN_MLP = {"pre", "post", "mid", "pre_linear"}


def act_name(name: str, layer: int | None = None, sublayer: str | None = None) -> str:
    """A hook name from TransformerLens' shorthand, as its ``utils.get_act_name`` reads it:
    ``act_name("pattern", 1)`` is ``"blocks.1.attn.hook_pattern"``, ``act_name("resid_pre", 0)``
    ``"blocks.0.hook_resid_pre"``, ``act_name("scale", 0, "ln1")`` ``"blocks.0.ln1.hook_scale"``,
    ``act_name("scale")`` ``"ln_final.hook_scale"``, ``act_name("k6")`` ``"blocks.6.attn.hook_k"``;
    a full name (with a dot, or starting ``hook_``) is itself."""
    if ("." in name or name.startswith("hook_")) and layer is None and sublayer is None:
        return name
    short = _SHORT.match(name)
    if short is not None:
        name, layer, sublayer = short[1], int(short[2]), short[3] or None
    name = _ACT_ALIASES.get(name, name)
    if name in _IN_ATTENTION:
        sublayer = "attn"
    elif name in _IN_MLP:
        sublayer = "mlp"
    elif sublayer in _SUBLAYER_ALIASES:
        sublayer = _SUBLAYER_ALIASES[sublayer]
    prefix = ("" if layer is None else f"blocks.{layer}.") + (f"{sublayer}." if sublayer else "")
    if layer is None and name in ("scale", "normalized"):
        prefix = "ln_final." + prefix
    return f"{prefix}hook_{name}"
