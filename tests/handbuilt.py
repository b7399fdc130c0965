"""Hand-built models whose algorithms are known in advance (in the spirit of the paper's companion
exercises): every analysis must find exactly what was planted.

The residual stream is split into named blocks of one-hot coordinates, so each head's weights
are written by reading one block and writing another.
"""

from __future__ import annotations

import torch

import qkov


def induction_model(d_vocab: int = 64, n_ctx: int = 12) -> qkov.AttnOnlyTransformer:
    """Two layers, standard positions. L0H0 is a previous-token head (queries and keys read the
    position block) that copies the previous token into a "previous token" block; L1H0 is an
    induction head whose queries read the current token and whose keys read that block (K-composition),
    with a small preference for recent positions, and whose OV copies the attended token to the
    logits. L0H1 and L1H1 are small random heads.

    Residual blocks: token ``[0, V)``, position ``[V, V + n_ctx)``, previous token
    ``[V + n_ctx, 2V + n_ctx)``, a constant 1 at ``2V + n_ctx``.
    """
    V, P = d_vocab, n_ctx
    tok, pos, prev, const = 0, V, V + P, 2 * V + P
    d_model, d_head = 2 * V + P + 1, V + 1
    cfg = qkov.Config(
        n_layers=2,
        n_heads=2,
        d_model=d_model,
        d_head=d_head,
        d_vocab=V,
        n_ctx=P,
        positional_embedding="standard",
    )
    model = qkov.AttnOnlyTransformer(cfg)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=gen) * 0.01)
        model.W_E.zero_()
        model.W_E[:, tok:pos] = torch.eye(V)
        model.W_E[:, const] = 1.0
        model.W_pos.zero_()
        model.W_pos[:, pos:prev] = torch.eye(P)
        model.W_U.zero_()
        model.W_U[tok:pos] = torch.eye(V)
        sharp = 100.0 * d_head**0.5  # pre-softmax scores of 100 for a match
        a0, a1 = model.blocks[0].attn, model.blocks[1].attn
        for W in (a0.W_Q, a0.W_K, a0.W_V, a0.W_O, a1.W_Q, a1.W_K, a1.W_V, a1.W_O):
            W[0].zero_()
        for p in range(P):  # previous-token head: position dest attends to position dest - 1
            a0.W_Q[0, pos + p, p] = sharp
            if p + 1 < d_head:
                a0.W_K[0, pos + p, p + 1] = 1.0
        for t in range(V):
            a0.W_V[0, tok + t, t] = 1.0
            a0.W_O[0, t, prev + t] = 1.0
            a1.W_Q[0, tok + t, t] = sharp  # induction: my token ...
            a1.W_K[0, prev + t, t] = 1.0  # ... matches the source's previous token
            a1.W_V[0, tok + t, t] = 1.0
            a1.W_O[0, t, tok + t] = 20.0  # and its own token is predicted
        a1.W_Q[0, const, V] = 12.0 * d_head**0.5  # recency: +12 per position of the source
        for p in range(P):
            a1.W_K[0, pos + p, V] = float(p)
    return model


def skip_trigram_model(planted: list[tuple[int, int, int]], d_vocab: int = 16) -> qkov.AttnOnlyTransformer:
    """One layer, no positions, ``W_E = W_U = I``. Head 0 implements the ``planted``
    skip-trigrams ``(source, destination, out)``: its QK circuit makes each destination attend to
    its source, its OV circuit maps each source to its out. Head 1 copies (OV = +I), head 2
    anti-copies (OV = -I); their QK circuits are zero (uniform attention)."""
    V = d_vocab
    cfg = qkov.Config(
        n_layers=1, n_heads=3, d_model=V, d_head=V, d_vocab=V, n_ctx=8, positional_embedding="none"
    )
    model = qkov.AttnOnlyTransformer(cfg)
    with torch.no_grad():
        for param in model.parameters():
            param.zero_()
        model.W_E.copy_(torch.eye(V))
        model.W_U.copy_(torch.eye(V))
        attn = model.blocks[0].attn
        for i, (source, destination, out) in enumerate(planted):
            attn.W_Q[0, destination, i] = 8.0
            attn.W_K[0, source, i] = 8.0
            attn.W_V[0, source, source] = 1.0
            attn.W_O[0, source, out] = 5.0
        attn.W_V[1] = torch.eye(V)
        attn.W_O[1] = torch.eye(V)
        attn.W_V[2] = torch.eye(V)
        attn.W_O[2] = -torch.eye(V)
    return model
