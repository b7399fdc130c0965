"""An independent float64 implementation of the attention-only transformer, written plainly
(loops over heads, explicit softmax), against which qkov's model is tested."""

from __future__ import annotations

import math

import numpy as np


def reference_forward(weights: dict[str, np.ndarray], cfg, tokens: np.ndarray, patterns=None):
    """Logits, per-layer patterns [batch, head, dest, src] and head writes [batch, pos, head, d_model]."""
    w = {k: np.asarray(v, dtype=np.float64) for k, v in weights.items()}
    batch, n = tokens.shape
    resid = w["W_E"][tokens]
    pos = w["W_pos"][:n] if "W_pos" in w else np.zeros((n, cfg.d_model))
    if cfg.positional_embedding == "standard":
        resid = resid + pos
    qk_extra = pos if cfg.positional_embedding == "shortformer" else np.zeros_like(pos)
    all_patterns, all_writes = [], []
    for layer in range(cfg.n_layers):
        p = f"blocks.{layer}.attn."
        bias = lambda name, shape, p=p: w.get(p + name, np.zeros(shape))  # noqa: E731
        writes = np.zeros((batch, n, cfg.n_heads, cfg.d_model))
        layer_patterns = np.zeros((batch, cfg.n_heads, n, n))
        for b in range(batch):
            x = resid[b]
            for h in range(cfg.n_heads):
                q = (x + qk_extra) @ w[p + "W_Q"][h] + bias("b_Q", (cfg.n_heads, cfg.d_head))[h]
                k = (x + qk_extra) @ w[p + "W_K"][h] + bias("b_K", (cfg.n_heads, cfg.d_head))[h]
                v = x @ w[p + "W_V"][h] + bias("b_V", (cfg.n_heads, cfg.d_head))[h]
                if patterns is None:
                    scores = q @ k.T / math.sqrt(cfg.d_head)
                    scores[np.triu_indices(n, 1)] = -np.inf
                    scores = np.exp(scores - scores.max(axis=1, keepdims=True))
                    pattern = scores / scores.sum(axis=1, keepdims=True)
                else:
                    pattern = np.asarray(patterns[layer][b, h], dtype=np.float64)
                layer_patterns[b, h] = pattern
                writes[b, :, h] = pattern @ v @ w[p + "W_O"][h]
        resid = resid + writes.sum(axis=2) + bias("b_O", (cfg.d_model,))
        all_patterns.append(layer_patterns)
        all_writes.append(writes)
    logits = resid @ w["W_U"] + w.get("b_U", np.zeros(cfg.d_vocab))
    return logits, all_patterns, all_writes, resid
