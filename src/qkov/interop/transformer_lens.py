"""Moving models between qkov and TransformerLens (same weight names and shapes, other prefixes).

A TransformerLens model on disk, as qkov reads it, is a folder with ``model.safetensors`` (its
``state_dict()``) and ``config.json`` (the JSON-serialisable fields of ``cfg.to_dict()``):
:func:`save_transformer_lens` writes one. Reading one needs no TransformerLens installed.

TransformerLens 3.x models are ``HookedTransformer`` objects (:func:`to_hooked_transformer`);
TransformerLens 4.0 removed that class, and its models are ``TransformerBridge`` objects
(:func:`to_transformer_bridge`, :mod:`qkov.interop.transformer_bridge`). Each way out refuses in
one line when the other version is installed; the ways in take either.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from qkov.config import ACT_FNS, Config
from qkov.errors import QkovError
from qkov.interop.source import check_finite, model_from_source, read_source
from qkov.interop.tl_legacy import is_legacy, legacy_config_dict
from qkov.interop.transformer_bridge import (
    boot_bridge,
    bridge_state,
    is_transformer_bridge,
    require_transformer_lens,
    shape_fields,
)
from qkov.io import atomic_write, atomic_write_text
from qkov.model import Transformer

_TOP_LEVEL = {"W_E": "embed.W_E", "W_pos": "pos_embed.W_pos", "W_U": "unembed.W_U", "b_U": "unembed.b_U"}
_FROM_TOP_LEVEL = {theirs: ours for ours, theirs in _TOP_LEVEL.items()}
# TransformerLens' state dict holds these; they are not weights
_BUFFERS = (".attn.mask", ".attn.IGNORE", ".attn.rotary_sin", ".attn.rotary_cos")
_NORMALIZATIONS = {None: "none", "LN": "LN", "LNPre": "LNPre", "RMS": "RMS", "RMSPre": "RMSPre"}


def to_transformer_lens(model: Transformer) -> dict[str, torch.Tensor]:
    """A state dict for TransformerLens' ``HookedTransformer`` with the configuration of
    :func:`hooked_transformer_config`. Absent biases are written as zeros, since TransformerLens
    always has them. Load it with ``strict=False`` (TransformerLens also holds mask buffers)."""
    state = {}
    for name, param in model.named_parameters():
        state[_TOP_LEVEL.get(name, name)] = param.detach().clone()
    cfg = model.cfg
    _check_gated_biases(state, cfg)
    kv = "_" if cfg.n_kv_heads != cfg.n_heads else ""
    zeros = {
        "attn.b_Q": (cfg.n_heads, cfg.d_head),
        f"attn.{kv}b_K": (cfg.n_kv_heads, cfg.d_head),
        f"attn.{kv}b_V": (cfg.n_kv_heads, cfg.d_head),
        "attn.b_O": (cfg.d_model,),
    }
    if cfg.has_mlp:
        zeros |= {"mlp.b_in": (cfg.d_mlp,), "mlp.b_out": (cfg.d_model,)}
    dtype = model.W_E.dtype
    for layer in range(cfg.n_layers):
        for bias, shape in zeros.items():
            state.setdefault(f"blocks.{layer}.{bias}", torch.zeros(shape, dtype=dtype))
    state.setdefault("unembed.b_U", torch.zeros(cfg.d_out, dtype=dtype))
    return state


def _check_gated_biases(state: dict[str, torch.Tensor], cfg: Config) -> None:
    """TransformerLens' gated MLP adds ``b_in`` after the gate (``act(x W_gate) * (x W_in) + b_in``)
    and has no gate bias: a gated model's biases there must be zero to move either way (dropped)."""
    if not cfg.gated_mlp:
        return
    for layer in range(cfg.n_layers):
        for name in (f"blocks.{layer}.mlp.b_in", f"blocks.{layer}.mlp.b_gate"):
            bias = state.pop(name, None)
            if bias is not None and bool(bias.any()):
                raise QkovError(
                    f"{name}: TransformerLens' gated MLP adds b_in after the gate and has no gate bias; "
                    "a gated MLP with these biases cannot move between the two"
                )


def hooked_state(model: Transformer) -> dict[str, torch.Tensor]:
    """:func:`to_transformer_lens` for a model with positions: TransformerLens has no ``"none"``
    positional scheme, so such a model gets standard positions with ``W_pos = 0``, the same model."""
    state = to_transformer_lens(model)
    cfg = model.cfg
    if cfg.positional_embedding == "none":
        state["pos_embed.W_pos"] = torch.zeros(cfg.n_ctx, cfg.d_model, dtype=model.W_E.dtype)
    return state


def _import_transformer_lens(what: str):
    """TransformerLens 3.x, the last with ``HookedTransformer``, or one line saying so."""
    require_transformer_lens(3, what, "use qkov.interop.to_transformer_bridge")
    import transformer_lens as tl

    return tl


def hooked_transformer_config(cfg: Config, dtype: torch.dtype, cache_head_results: bool = True):
    """The ``HookedTransformerConfig`` of the same model. TransformerLens has no ``"none"``
    positional scheme: it gets standard positions with ``W_pos = 0``, the same model.
    TransformerLens 3.x only (4.0 removed it)."""
    tl = _import_transformer_lens("hooked_transformer_config")
    return tl.HookedTransformerConfig(
        **shape_fields(cfg),
        **transformer_lens_fields(cfg),
        d_vocab_out=cfg.d_out,
        act_fn=cfg.act_fn if cfg.has_mlp else None,
        device="cpu",
        dtype=dtype,
        use_attn_result=cache_head_results,
        positional_embedding_type="standard"
        if cfg.positional_embedding == "none"
        else cfg.positional_embedding,
    )


def transformer_lens_fields(cfg: Config) -> dict[str, Any]:
    """The TransformerLens config fields of a qkov config's newer options (the inverse of
    :func:`transformer_lens_options`), refusing in one line what TransformerLens cannot express."""
    windows = {w for w in cfg.layer_windows or () if w is not None}
    for refused, why in (
        (cfg.qk_norm == "all", "a query norm over all heads (OLMo 2)"),
        (not cfg.pre_norms, "norms after each sublayer only (OLMo 2)"),
        (len(windows) > 1, "sliding windows of several sizes"),
    ):
        if refused:
            raise QkovError(f"TransformerLens has no {why}: this model cannot be exported to it")
    fields: dict[str, Any] = dict(
        n_key_value_heads=cfg.n_key_value_heads,
        gated_mlp=cfg.gated_mlp,
        parallel_attn_mlp=cfg.parallel_attn_mlp,
        use_qk_norm=cfg.qk_norm == "head",
        use_normalization_before_and_after=cfg.post_norms,
        scale_attn_by_inverse_layer_idx=cfg.scale_attn_by_inverse_layer_idx,
        attn_scores_soft_cap=cfg.attn_scores_soft_cap or -1.0,
        output_logits_soft_cap=cfg.output_logits_soft_cap or -1.0,
        attention_dir=cfg.attention_dir,
    )
    if cfg.attn_scale is not None:
        fields["attn_scale"] = cfg.attn_scale
    if windows:
        fields |= dict(
            use_local_attn=True,
            window_size=windows.pop(),
            attn_types=["global" if w is None else "local" for w in cfg.layer_windows],
        )
    if cfg.positional_embedding == "rotary":
        fields |= _rotary_fields(cfg)
    return fields


def _rotary_fields(cfg: Config) -> dict[str, Any]:
    scaling = cfg.rotary_scaling or {}
    fields = dict(
        rotary_dim=cfg.rotary_dim or cfg.d_head,
        rotary_base=cfg.rotary_base,
        rotary_adjacent_pairs=cfg.rotary_interleaved,
    )
    if scaling.get("rope_type") == "llama3":
        fields |= dict(
            use_NTK_by_parts_rope=True,
            NTK_by_parts_factor=scaling["factor"],
            NTK_by_parts_low_freq_factor=scaling["low_freq_factor"],
            NTK_by_parts_high_freq_factor=scaling["high_freq_factor"],
            NTK_original_ctx_len=scaling["original_max_position_embeddings"],
        )
    elif scaling.get("rope_type") == "linear":
        fields["rotary_scaling_factor"] = scaling["factor"]
    if cfg.rotary_local_base is not None:
        fields["rotary_base_local"] = cfg.rotary_local_base
    return fields


def to_hooked_transformer(model: Transformer, cache_head_results: bool = True):
    """The same model as a TransformerLens 3.x ``HookedTransformer`` (with TransformerLens 4,
    which removed it, use :func:`to_transformer_bridge`), in the model's dtype;
    ``cache_head_results`` sets its ``use_attn_result`` (per-head writes in the cache, at some
    cost in speed)."""
    tl = _import_transformer_lens("to_hooked_transformer")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # TransformerLens 3 warns on construction
        config = hooked_transformer_config(model.cfg, model.W_E.dtype, cache_head_results)
        hooked = tl.HookedTransformer(config)
    hooked.load_state_dict(hooked_state(model), strict=False)
    return hooked


def to_transformer_bridge(model: Transformer):
    """The same model as a TransformerLens 4 ``TransformerBridge``, in the model's dtype:
    ``TransformerBridge.boot_native`` of the same configuration, holding the model's weights
    through TransformerLens' ``convert_tl_checkpoint`` (:mod:`qkov.interop.transformer_bridge`).
    A shortformer model is refused (the native bridge has no such positions); with TransformerLens
    3.x, use :func:`to_hooked_transformer`."""
    require_transformer_lens(4, "to_transformer_bridge", "use qkov.interop.to_hooked_transformer")
    if model.cfg.features:
        raise QkovError(
            f"to_transformer_bridge: a model with {model.cfg.features[0]} is not exported to "
            "TransformerLens 4's native bridge; TransformerLens 3's to_hooked_transformer takes it"
        )
    return boot_bridge(model.cfg, hooked_state(model))


def _config_and_weights(hooked: Any) -> tuple[dict[str, Any], dict[str, torch.Tensor], str]:
    """A ``HookedTransformer``'s or a ``TransformerBridge``'s ``cfg.to_dict()``, its weights in
    TransformerLens' names and shapes, and what to call it in errors."""
    if is_transformer_bridge(hooked):
        config, state = bridge_state(hooked)
        _check_bridge(config, "TransformerBridge config")
        return config, state, "TransformerBridge"
    try:
        config, state = dict(hooked.cfg.to_dict()), dict(hooked.state_dict())
    except AttributeError:
        raise QkovError(
            f"expected a TransformerLens HookedTransformer or TransformerBridge, or a folder, "
            f"got {type(hooked).__name__}"
        ) from None
    return config, state, "HookedTransformer"


def save_transformer_lens(hooked: Any, folder: str | os.PathLike) -> Path:
    """Write a ``HookedTransformer`` (TransformerLens 3.x) or a ``TransformerBridge`` (4.x) as a
    folder qkov imports: ``model.safetensors`` (the weights in ``HookedTransformer.state_dict()``'s
    names and shapes) and ``config.json`` (the JSON-serialisable fields of its config)."""
    folder = Path(folder)
    cfg_data, weights, _ = _config_and_weights(hooked)
    tensors = {name: t.detach().contiguous().cpu() for name, t in weights.items()}
    config = {}
    for key, value in cfg_data.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            continue  # dtype, device objects: not needed to rebuild the model
        config[key] = value
    atomic_write(folder / "model.safetensors", lambda tmp: save_file(tensors, str(tmp)))
    atomic_write_text(folder / "config.json", json.dumps(config, indent=1) + "\n")
    return folder


# (config key, unsupported when, the feature's name)
_UNSUPPORTED = (
    (
        "positional_embedding_type",
        lambda v: v not in ("standard", "shortformer", "rotary"),
        "these positions",
    ),
    ("normalization_type", lambda v: v not in _NORMALIZATIONS, "this normalization"),
    ("final_rms", bool, "a final RMSNorm"),
    ("num_experts", lambda v: v not in (None, 0, 1), "mixture of experts"),
    ("post_embedding_ln", bool, "a LayerNorm after the embedding"),
    ("use_attention_sinks", bool, "attention sinks"),
    ("use_logn_attn", bool, "log-n attention scaling"),
    ("use_yarn_rope", bool, "YaRN rotary scaling"),
    ("use_dynamic_ntk_rope", bool, "dynamic NTK rotary scaling"),
    ("clip_qkv", lambda v: v is not None, "clipped queries, keys and values"),
    ("ungroup_grouped_query_attention", bool, "grouped-query attention stored ungrouped"),
)
_REQUIRED = ("n_layers", "n_heads", "d_model", "d_head", "d_vocab", "n_ctx")


def transformer_lens_config(data: dict, where: str) -> Config:
    """The qkov config of a TransformerLens ``cfg.to_dict()`` or of a legacy config
    (:mod:`qkov.interop.tl_legacy`), refusing what qkov cannot run with one line naming the feature
    and the config key."""
    if is_legacy(data):
        data = legacy_config_dict(data, where)
    for key, unsupported, feature in _UNSUPPORTED:
        if key in data and unsupported(data[key]):
            raise QkovError(f"{where}: {feature} is not supported ({key}={data[key]!r})")
    missing = [key for key in _REQUIRED if key not in data]
    if missing:
        raise QkovError(f"{where}: missing field(s) {', '.join(missing)}")
    d_mlp = 0 if data.get("attn_only") or data.get("d_mlp") is None else data["d_mlp"]
    act_fn = data.get("act_fn") or "gelu_new"
    if not d_mlp and act_fn not in ACT_FNS:
        act_fn = "gelu_new"  # unused without an MLP (Neel's attention-only models say "solu_ln")
    if act_fn not in ACT_FNS:
        raise QkovError(
            f"{where}: activation {act_fn!r} is not supported (act_fn; one of {', '.join(ACT_FNS)})"
        )
    out = data.get("d_vocab_out", -1)
    return Config(
        **{key: data[key] for key in _REQUIRED},
        positional_embedding=data.get("positional_embedding_type", "standard"),
        normalization=_NORMALIZATIONS[data.get("normalization_type", "LN")],
        d_mlp=d_mlp,
        act_fn=act_fn,
        ln_eps=float(data.get("eps", 1e-5)),
        source="transformer_lens",
        d_vocab_out=None if out in (-1, None, data["d_vocab"]) else out,
        **transformer_lens_options(data),
    )


def transformer_lens_options(data: dict) -> dict[str, Any]:
    """The options of the newer architectures a TransformerLens config sets, in qkov's fields."""
    heads, kv = data["n_heads"], data.get("n_key_value_heads")
    scale = data.get("attn_scale")
    if data.get("use_attn_scale") is False:
        scale = 1.0
    elif scale is None or scale <= 0 or math.isclose(float(scale), math.sqrt(data["d_head"]), rel_tol=1e-12):
        scale = None  # the default, sqrt(d_head) (TransformerLens 4 marks it with -1)
    windows = None
    if data.get("use_local_attn") and data.get("attn_types"):
        windows = tuple(data["window_size"] if t == "local" else None for t in data["attn_types"])
    options = dict(
        n_key_value_heads=None if kv in (None, heads) else kv,
        gated_mlp=bool(data.get("gated_mlp")),
        parallel_attn_mlp=bool(data.get("parallel_attn_mlp")),
        attn_scale=scale,
        qk_norm="head" if data.get("use_qk_norm") else "none",
        post_norms=bool(data.get("use_normalization_before_and_after")),
        scale_attn_by_inverse_layer_idx=bool(data.get("scale_attn_by_inverse_layer_idx")),
        attn_scores_soft_cap=_cap(data.get("attn_scores_soft_cap")),
        output_logits_soft_cap=_cap(data.get("output_logits_soft_cap")),
        layer_windows=windows,
        attention_dir=data.get("attention_dir", "causal"),
    )
    return options | (_tl_rotary(data) if data.get("positional_embedding_type") == "rotary" else {})


# A TransformerLens 4 bridge's weights come through its own conversion (``bridge_state``), checked
# against its forward for learned positions and LayerNorm only (with rotary positions or RMSNorm its
# import differed by order one): the newer options are read from TransformerLens 3 objects and their
# folders, and refused from a bridge (read or saved) until that path is checked.
_BRIDGE_UNCHECKED = (
    ("positional_embedding_type", lambda v: v not in ("standard", "shortformer"), "these positions"),
    ("normalization_type", lambda v: v not in (None, "LN", "LNPre"), "this normalization"),
    ("n_key_value_heads", lambda v: v is not None, "grouped-query attention"),
    ("gated_mlp", bool, "a gated MLP"),
    ("parallel_attn_mlp", bool, "parallel attention and MLP"),
    ("use_qk_norm", bool, "query and key norms"),
    ("use_normalization_before_and_after", bool, "norms after each sublayer"),
)


def _check_bridge(data: dict, where: str) -> None:
    for key, unchecked, feature in _BRIDGE_UNCHECKED:
        if key in data and unchecked(data[key]):
            raise QkovError(
                f"{where}: {feature} is not supported from a TransformerBridge yet ({key}={data[key]!r}); "
                "TransformerLens 3's HookedTransformer of the model, or its folder, is read"
            )


def _cap(value: Any) -> float | None:
    return float(value) if value is not None and value > 0 else None


def _tl_rotary(data: dict) -> dict[str, Any]:
    """TransformerLens' rotary settings: ``rotary_adjacent_pairs`` is GPT-J's interleaved layout,
    ``use_NTK_by_parts_rope`` Llama 3's scaling, ``rotary_scaling_factor`` the linear one."""
    scaling = None
    if data.get("use_NTK_by_parts_rope"):
        scaling = {
            "rope_type": "llama3",
            "factor": data["NTK_by_parts_factor"],
            "low_freq_factor": data["NTK_by_parts_low_freq_factor"],
            "high_freq_factor": data["NTK_by_parts_high_freq_factor"],
            "original_max_position_embeddings": data["NTK_original_ctx_len"],
        }
    elif data.get("rotary_scaling_factor", 1.0) not in (None, 1.0):
        scaling = {"rope_type": "linear", "factor": float(data["rotary_scaling_factor"])}
    rotary = data.get("rotary_dim")
    return dict(
        rotary_dim=None if rotary in (None, data["d_head"]) else rotary,
        rotary_base=float(data.get("rotary_base", 10000)),
        rotary_interleaved=bool(data.get("rotary_adjacent_pairs")),
        rotary_scaling=scaling,
        rotary_local_base=data.get("rotary_base_local"),
    )


def transformer_lens_tensors(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """TransformerLens' weights (its mask buffers dropped) in qkov's names."""
    return {_FROM_TOP_LEVEL.get(name, name): t for name, t in weights.items()}


def _drop_gated_biases(tensors: dict[str, torch.Tensor], cfg: Config) -> dict[str, torch.Tensor]:
    tensors = dict(tensors)
    _check_gated_biases(tensors, cfg)
    return tensors


def from_transformer_lens(
    hooked_or_folder: Any, fold: bool = True, config: str | os.PathLike | None = None
) -> Transformer:
    """A qkov model from a TransformerLens ``HookedTransformer`` (3.x) or ``TransformerBridge`` (3.x
    or 4.x, whose config qkov can run: learned or no positions, LayerNorm or none, no rotary, RMSNorm
    or grouped-query attention), or from a folder or weights file:
    ``model.safetensors`` or a pickled ``.pth``/``.pt`` state dict (read by
    :mod:`qkov.pickles`) beside a ``config.json`` from ``cfg.to_dict()`` (as
    :func:`save_transformer_lens` writes) or in the legacy keys of Neel Nanda's models
    (:mod:`qkov.interop.tl_legacy`); ``config`` replaces the ``config.json`` beside the weights.
    Folded by default (:func:`qkov.interop.fold.fold`). Raises :class:`QkovError` with one line
    for what is missing, broken or unsupported."""
    if isinstance(hooked_or_folder, str | os.PathLike):
        source = read_source(hooked_or_folder, config)
        cfg = transformer_lens_config(source.config, str(source.config_file))
        tensors, where, tokenizer = source.tensors, str(source.weights), source.tokenizer_folder
    else:
        cfg_data, tensors, where = _config_and_weights(hooked_or_folder)
        cfg = transformer_lens_config(cfg_data, f"{where} config")
        tokenizer = None
    weights = {name: t for name, t in tensors.items() if not name.endswith(_BUFFERS)}
    check_finite(weights, where)
    tensors = _drop_gated_biases(transformer_lens_tensors(weights), cfg)
    return model_from_source(cfg, tensors, where, tokenizer, fold)
