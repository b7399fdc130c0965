"""Moving weights between qkov and TransformerLens (same names and shapes, other prefixes)."""

from __future__ import annotations

import torch

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
