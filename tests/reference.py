"""An independent float64 implementation of the transformer, written plainly (loops over heads,
explicit softmax, LayerNorm and GELU from their formulas), against which qkov's model is tested."""

from __future__ import annotations

import math

import numpy as np


def layer_norm(x: np.ndarray, w: dict, name: str | None, cfg) -> np.ndarray:
    """LayerNorm as GPT-2 defines it (biased variance, eps inside the root); with ``LNPre`` no
    weight or bias; with no normalization the identity."""
    if cfg.normalization == "none":
        return x
    centred = x - x.mean(axis=-1, keepdims=True)
    out = centred / np.sqrt((centred**2).mean(axis=-1, keepdims=True) + cfg.ln_eps)
    return out * w[name + ".w"] + w[name + ".b"] if cfg.normalization == "LN" else out


def activation(x: np.ndarray, act_fn: str) -> np.ndarray:
    if act_fn == "relu":
        return np.maximum(x, 0.0)
    if act_fn == "gelu":
        erf = np.vectorize(math.erf)
        return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))  # gelu_new


def reference_forward(weights: dict[str, np.ndarray], cfg, tokens: np.ndarray, patterns=None, replace=None):
    """Logits, per-layer patterns [batch, head, dest, src], head writes [batch, pos, head, d_model]
    and the final residual stream (before the final LayerNorm). ``replace``: ``{(layer, head):
    write}``, a head's write replaced by an array broadcast to ``[batch, pos, d_model]``."""
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
            x = layer_norm(resid[b], w, f"blocks.{layer}.ln1", cfg)
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
        for (at, h), write in (replace or {}).items():
            if at == layer:
                writes[:, :, h] = np.broadcast_to(write, (batch, n, cfg.d_model))
        resid = resid + writes.sum(axis=2) + bias("b_O", (cfg.d_model,))
        if cfg.d_mlp:
            m = f"blocks.{layer}.mlp."
            x = layer_norm(resid, w, f"blocks.{layer}.ln2", cfg)
            hidden = activation(x @ w[m + "W_in"] + w.get(m + "b_in", 0.0), cfg.act_fn)
            resid = resid + hidden @ w[m + "W_out"] + w.get(m + "b_out", 0.0)
        all_patterns.append(layer_patterns)
        all_writes.append(writes)
    final = layer_norm(resid, w, "ln_final", cfg)
    logits = final @ w["W_U"] + w.get("b_U", np.zeros(cfg.d_out))
    return logits, all_patterns, all_writes, resid
