"""TransformerLens-legacy configs: the ``config.json`` that Neel Nanda's toy models (and others
trained with his scripts) carry beside their ``.pth`` state dicts, in their own keys.

The keys map onto a TransformerLens ``cfg.to_dict()`` as TransformerLens 3.x's
``convert_neel_model_config`` documents: ``d_model``, ``n_layers``, ``d_mlp``, ``d_head``,
``n_heads``, ``n_ctx``, ``d_vocab``, ``act_fn``, ``attn_only`` and ``final_rms`` keep their names;
``normalization`` (``"LN"``, ``"LNPre"`` or null) is ``normalization_type``; ``shortformer_pos``
(true/false) is ``positional_embedding_type`` ``"shortformer"``/``"standard"``. Training keys
(learning rates, batch sizes, seeds ...) describe no weight and are not read. The state dict is
already in TransformerLens' names. Only the ``"neel"`` layout (``architecture``, its default) is
TransformerLens' own; the older SoLU and minGPT layouts have other tensor names and are refused.
"""

from __future__ import annotations

from typing import Any

from qkov.errors import QkovError

_KEPT = ("d_model", "n_layers", "d_mlp", "d_head", "n_heads", "n_ctx", "d_vocab", "act_fn", "attn_only")


def is_legacy(data: dict[str, Any]) -> bool:
    """Whether a config is in the legacy keys (``normalization``/``shortformer_pos``, none of
    TransformerLens' own ``normalization_type``/``positional_embedding_type``, nor qkov's)."""
    legacy = "normalization" in data or "shortformer_pos" in data
    current = {"normalization_type", "positional_embedding_type", "positional_embedding"} & set(data)
    return legacy and not current


def legacy_config_dict(data: dict[str, Any], where: str) -> dict[str, Any]:
    """The TransformerLens ``cfg.to_dict()`` keys of a legacy config (see the module docstring),
    with one line for a missing key or another layout."""
    architecture = data.get("architecture", "neel")
    if architecture != "neel":
        raise QkovError(f"{where}: the {architecture!r} weight layout is not supported (architecture)")
    needed = ["attn_only", "normalization"] + ([] if data.get("attn_only") else ["d_mlp", "act_fn"])
    missing = [key for key in needed if key not in data]
    if missing:
        raise QkovError(f"{where}: missing field(s) {', '.join(missing)}")
    tl = {key: data[key] for key in _KEPT if key in data}
    return tl | {
        "final_rms": data.get("final_rms", False),
        "normalization_type": data["normalization"],
        "positional_embedding_type": "shortformer" if data.get("shortformer_pos") else "standard",
    }
