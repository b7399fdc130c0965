"""TransformerLens 4: models out through ``TransformerBridge.boot_native``, models in from any
``TransformerBridge``, and which TransformerLens is installed.

TransformerLens 4.0 removed ``HookedTransformer``; its models are ``TransformerBridge`` objects.
Going out, :func:`to_transformer_bridge` boots the bridge's TransformerLens-native model from the
same configuration and loads qkov's weights into it the way TransformerLens 4 documents for a
``HookedTransformer.state_dict()``: ``convert_tl_checkpoint(state_dict, cfg)``, then
``bridge.load_state_dict(converted, strict=True)``. Coming in, :func:`bridge_state` reads a
bridge's weights through its ``get_params()`` (TransformerLens' names and per-head shapes, the
layout of a ``HookedTransformer.state_dict()``) and its ``cfg.to_dict()``, which
:func:`qkov.interop.transformer_lens.from_transformer_lens` reads as it reads TransformerLens 3's.

Reading a folder needs no TransformerLens at all; only these conversions import it.
"""

from __future__ import annotations

import importlib.metadata
from typing import Any

import torch

from qkov.config import Config
from qkov.errors import QkovError

_MLP = ".mlp."


def installed_transformer_lens() -> str | None:
    """The installed TransformerLens' version, or None."""
    try:
        return importlib.metadata.version("transformer-lens")
    except importlib.metadata.PackageNotFoundError:
        return None


def require_transformer_lens(major: int, what: str, instead: str) -> None:
    """Refuse in one line unless TransformerLens ``major``.x is installed; ``instead`` says what
    to use with the other version."""
    version = installed_transformer_lens()
    needs = f"{what} needs TransformerLens {major}.x"
    install = f"pip install 'transformer-lens>={major},<{major + 1}'"
    if version is None:
        raise QkovError(f"{needs}, which is not installed: {install}")
    if int(version.split(".")[0]) != major:
        raise QkovError(f"{needs} (this is {version}): {instead}, or {install}")


def is_transformer_bridge(obj: Any) -> bool:
    """Whether ``obj`` is a TransformerLens ``TransformerBridge`` (told without importing
    TransformerLens, so that qkov never needs it to read anything else)."""
    return any(
        cls.__name__ == "TransformerBridge" and cls.__module__.startswith("transformer_lens.")
        for cls in type(obj).__mro__
    )


def bridge_config(cfg: Config, dtype: torch.dtype):
    """The ``TransformerBridgeConfig`` of the same model for ``boot_native``. TransformerLens 4's
    native model has learned (standard) or rotary positions only: qkov's ``"none"`` becomes
    standard positions with ``W_pos = 0`` (the same model), and shortformer positions are refused
    (TransformerLens 3's ``HookedTransformer`` has them)."""
    if cfg.positional_embedding == "shortformer":
        raise QkovError(
            "TransformerLens 4's native bridge has no shortformer positions "
            "(positional_embedding='shortformer'): use to_hooked_transformer with TransformerLens 3.x"
        )
    from transformer_lens import TransformerBridgeConfig

    return TransformerBridgeConfig(
        **shape_fields(cfg),
        act_fn=cfg.act_fn,
        positional_embedding_type="standard",
        dtype=dtype,
        init_weights=False,  # every weight is loaded, strictly, right after
    )


def shape_fields(cfg: Config) -> dict[str, Any]:
    """The fields TransformerLens' configs (3.x ``HookedTransformerConfig``, 4.x
    ``TransformerBridgeConfig``) share, from a qkov config."""
    return {
        "n_layers": cfg.n_layers,
        "d_model": cfg.d_model,
        "n_heads": cfg.n_heads,
        "d_head": cfg.d_head,
        "d_vocab": cfg.d_vocab,
        "n_ctx": cfg.n_ctx,
        "attn_only": not cfg.has_mlp,
        "d_mlp": cfg.d_mlp if cfg.has_mlp else None,
        "normalization_type": None if cfg.normalization == "none" else cfg.normalization,
        "eps": cfg.ln_eps,
    }


def boot_bridge(cfg: Config, state: dict[str, torch.Tensor]):
    """A ``TransformerBridge`` (TransformerLens 4) of ``cfg`` holding ``state``, a
    ``HookedTransformer``-layout state dict (every weight and bias, as
    :func:`qkov.interop.transformer_lens.hooked_state` gives)."""
    from transformer_lens import TransformerBridge
    from transformer_lens.utilities.tl_checkpoint_conversion import convert_tl_checkpoint

    dtype = state["embed.W_E"].dtype
    bridge_cfg = bridge_config(cfg, dtype)
    bridge = TransformerBridge.boot_native(bridge_cfg, dtype=dtype)
    bridge.load_state_dict(convert_tl_checkpoint(state, bridge_cfg), strict=True)
    return bridge


def bridge_state(bridge: Any) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A bridge's ``cfg.to_dict()`` and its weights in TransformerLens' names and shapes.
    ``get_params()`` fills an attention-only model's absent MLPs with zeros: those are dropped."""
    config = dict(bridge.cfg.to_dict())
    params = bridge.get_params()
    attn_only = bool(config.get("attn_only"))
    tensors = {name: t.detach() for name, t in params.items() if not (attn_only and _MLP in name)}
    return config, tensors
