"""Moving weights between qkov and TransformerLens (same names and shapes, other prefixes)."""

from __future__ import annotations

import warnings

import torch

from qkov.errors import QkovError
from qkov.model import AttnOnlyTransformer

_TOP_LEVEL = {"W_E": "embed.W_E", "W_pos": "pos_embed.W_pos", "W_U": "unembed.W_U", "b_U": "unembed.b_U"}


def to_transformer_lens(model: AttnOnlyTransformer) -> dict[str, torch.Tensor]:
    """A state dict for TransformerLens' ``HookedTransformer`` (``attn_only=True``,
    ``normalization_type=None``). Absent biases are written as zeros, since TransformerLens always
    has them. Load it with ``strict=False`` (TransformerLens also holds mask buffers)."""
    state = {}
    for name, param in model.named_parameters():
        state[_TOP_LEVEL.get(name, name)] = param.detach().clone()
    cfg = model.cfg
    zeros = {
        "b_Q": (cfg.n_heads, cfg.d_head),
        "b_K": (cfg.n_heads, cfg.d_head),
        "b_V": (cfg.n_heads, cfg.d_head),
        "b_O": (cfg.d_model,),
    }
    dtype = model.W_E.dtype
    for layer in range(cfg.n_layers):
        for bias, shape in zeros.items():
            state.setdefault(f"blocks.{layer}.attn.{bias}", torch.zeros(shape, dtype=dtype))
    state.setdefault("unembed.b_U", torch.zeros(cfg.d_vocab, dtype=dtype))
    return state


def to_hooked_transformer(model: AttnOnlyTransformer, cache_head_results: bool = True):
    """The same model as a TransformerLens ``HookedTransformer`` (TransformerLens must be
    installed: ``pip install transformer-lens``), in the model's dtype; ``cache_head_results``
    sets its ``use_attn_result`` (per-head writes in the cache, at some cost in speed).
    TransformerLens has no ``"none"`` scheme: it gets standard positions with ``W_pos = 0``, the
    same model."""
    try:
        import transformer_lens as tl
    except ImportError:
        raise QkovError("TransformerLens is not installed: pip install transformer-lens") from None
    cfg = model.cfg
    tl_cfg = tl.HookedTransformerConfig(
        n_layers=cfg.n_layers,
        d_model=cfg.d_model,
        n_heads=cfg.n_heads,
        d_head=cfg.d_head,
        d_vocab=cfg.d_vocab,
        n_ctx=cfg.n_ctx,
        attn_only=True,
        normalization_type=None,
        device="cpu",
        dtype=model.W_E.dtype,
        use_attn_result=cache_head_results,
        positional_embedding_type="standard"
        if cfg.positional_embedding == "none"
        else cfg.positional_embedding,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # TransformerLens 3 warns on construction
        hooked = tl.HookedTransformer(tl_cfg)
    state = to_transformer_lens(model)
    if cfg.positional_embedding == "none":
        state["pos_embed.W_pos"] = torch.zeros(cfg.n_ctx, cfg.d_model, dtype=model.W_E.dtype)
    hooked.load_state_dict(state, strict=False)
    return hooked
