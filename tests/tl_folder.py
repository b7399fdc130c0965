"""A TransformerLens folder written without TransformerLens (for the tests that must run where it
is not installed): the ``HookedTransformer`` state dict and the ``cfg.to_dict()`` keys qkov reads,
as :func:`qkov.interop.save_transformer_lens` writes them."""

from __future__ import annotations

import json

from safetensors.torch import save_file

import qkov
from qkov.interop import to_transformer_lens


def transformer_lens_folder(folder, model: qkov.Transformer) -> None:
    cfg = model.cfg
    folder.mkdir()
    save_file(to_transformer_lens(model), str(folder / "model.safetensors"))
    config = {
        "n_layers": cfg.n_layers, "d_model": cfg.d_model, "n_heads": cfg.n_heads, "d_head": cfg.d_head,
        "d_vocab": cfg.d_vocab, "n_ctx": cfg.n_ctx, "attn_only": not cfg.has_mlp,
        "d_mlp": cfg.d_mlp or None, "act_fn": cfg.act_fn, "eps": cfg.ln_eps,
        "normalization_type": None if cfg.normalization == "none" else cfg.normalization,
        "positional_embedding_type": cfg.positional_embedding,
    }  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
