"""Hand-built models whose algorithms are known in advance, in the spirit of the paper's companion
exercises: a previous-token head and an induction head by K-composition (:func:`induction_model`),
planted skip-trigrams with copying and anti-copying heads (:func:`skip_trigram_model`), induction
by pointer arithmetic (Q-composition, :func:`pointer_arithmetic_model`), a virtual two-back head
(:func:`two_back_model`), a head attending to the last several tokens (:func:`with_recent_head`)
and an MLP neuron with a planted key and value (:func:`neuron_model`).
Every analysis must find exactly what was planted: the tests use them as fixtures, the tutorials
as worked examples.

The residual stream is split into named blocks of one-hot coordinates, so each head's weights
are written by reading one block and writing another.
"""

from __future__ import annotations

import torch

from qkov.config import Config
from qkov.model import AttnOnlyTransformer, Transformer


def blocks_model(d_vocab: int, n_ctx: int, d_model: int, d_head: int) -> AttnOnlyTransformer:
    """Two layers of two heads, standard positions, with the token block ``[0, V)`` as ``W_E`` and
    ``W_U`` (one-hot), the position block ``[V, V + n_ctx)`` as ``W_pos``, head 0 of each layer
    zeroed (to be written by the caller) and head 1 small and random."""
    V, P = d_vocab, n_ctx
    cfg = Config(
        n_layers=2,
        n_heads=2,
        d_model=d_model,
        d_head=d_head,
        d_vocab=V,
        n_ctx=P,
        positional_embedding="standard",
    )
    model = AttnOnlyTransformer(cfg)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=gen) * 0.01)
        model.W_E.zero_()
        model.W_E[:, :V] = torch.eye(V)
        model.W_pos.zero_()
        model.W_pos[:, V : V + P] = torch.eye(P)
        model.W_U.zero_()
        model.W_U[:V] = torch.eye(V)
        for block in model.blocks:
            for W in (block.attn.W_Q, block.attn.W_K, block.attn.W_V, block.attn.W_O):
                W[0].zero_()
    return model


def attend_to_previous(attn, pos: int, n_ctx: int, sharp: float) -> None:
    """Head 0's queries and keys read the position block so that position ``p`` attends to
    ``p - 1`` (position 0 to itself)."""
    for p in range(n_ctx):
        attn.W_Q[0, pos + p, p] = sharp
        if p + 1 < attn.W_K.shape[-1]:
            attn.W_K[0, pos + p, p + 1] = 1.0


def induction_model(d_vocab: int = 64, n_ctx: int = 12) -> AttnOnlyTransformer:
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
    model = blocks_model(V, P, d_model, d_head)
    with torch.no_grad():
        model.W_E[:, const] = 1.0
        sharp = 100.0 * d_head**0.5  # pre-softmax scores of 100 for a match
        a0, a1 = model.blocks[0].attn, model.blocks[1].attn
        attend_to_previous(a0, pos, P, sharp)
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


def skip_trigram_model(planted: list[tuple[int, int, int]], d_vocab: int = 16) -> AttnOnlyTransformer:
    """One layer, no positions, ``W_E = W_U = I``. Head 0 implements the ``planted``
    skip-trigrams ``(source, destination, out)``: its QK circuit makes each destination attend to
    its source, its OV circuit maps each source to its out. Head 1 copies (OV = +I), head 2
    anti-copies (OV = -I); their QK circuits are zero (uniform attention)."""
    V = d_vocab
    cfg = Config(n_layers=1, n_heads=3, d_model=V, d_head=V, d_vocab=V, n_ctx=8, positional_embedding="none")
    model = AttnOnlyTransformer(cfg)
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


def pointer_arithmetic_model(d_vocab: int = 32, n_ctx: int = 12) -> AttnOnlyTransformer:
    """Induction by Q-composition, with standard positions (the paper's "pointer arithmetic"). L0H0
    is a duplicate-token head: it attends to the earlier occurrence of the current token (not
    itself) and writes that occurrence's position plus one into a "pointer" block. L1H0's queries
    read the pointer and its keys read positions, so it attends to the token after the earlier
    occurrence, and copies it. L0H1 and L1H1 are small random heads.

    Residual blocks: token ``[0, V)``, position ``[V, V + n_ctx)``, pointer
    ``[V + n_ctx, V + 2 n_ctx)``.
    """
    V, P = d_vocab, n_ctx
    tok, pos, ptr = 0, V, V + P
    d_model, d_head = V + 2 * P, V + P
    model = blocks_model(V, P, d_model, d_head)
    with torch.no_grad():
        sharp = 100.0 * d_head**0.5
        a0, a1 = model.blocks[0].attn, model.blocks[1].attn
        for t in range(V):  # duplicate-token head: same token ...
            a0.W_Q[0, tok + t, t] = sharp
            a0.W_K[0, tok + t, t] = 1.0
        for p in range(P):  # ... but not the current position
            a0.W_Q[0, pos + p, V + p] = -sharp
            a0.W_K[0, pos + p, V + p] = 1.0
            a0.W_V[0, pos + p, p] = 1.0  # it reads the occurrence's position
            if p + 1 < P:
                a0.W_O[0, p, ptr + p + 1] = 1.0  # and writes "position + 1" as the pointer
            a1.W_Q[0, ptr + p, p] = sharp  # induction: attend where the pointer points
            a1.W_K[0, pos + p, p] = 1.0
        for t in range(V):
            a1.W_V[0, tok + t, t] = 1.0
            a1.W_O[0, t, tok + t] = 20.0
    return model


def two_back_model(d_vocab: int = 32, n_ctx: int = 12) -> AttnOnlyTransformer:
    """A virtual two-back head by V-composition, with standard positions. L0H0 and L1H0 are both
    previous-token heads; L0H0 copies the previous token into a "previous" block, L1H0 reads that
    block through its values and writes it to the logits. Alone neither predicts anything (L1H0's
    values read only the previous block, which W_U does not read from L0H0 directly); the path
    through both, ``("L0H0", "L1H0")``, predicts the token two back. L0H1 and L1H1 are small random
    heads.

    Residual blocks: token ``[0, V)``, position ``[V, V + n_ctx)``, previous token
    ``[V + n_ctx, 2V + n_ctx)``.
    """
    V, P = d_vocab, n_ctx
    tok, pos, prev = 0, V, V + P
    d_model, d_head = 2 * V + P, V + 1
    model = blocks_model(V, P, d_model, d_head)
    with torch.no_grad():
        sharp = 100.0 * d_head**0.5
        for layer, block in enumerate(model.blocks):
            a = block.attn
            attend_to_previous(a, pos, P, sharp)
            for t in range(V):
                if layer == 0:  # the previous token, into the previous block
                    a.W_V[0, tok + t, t] = 1.0
                    a.W_O[0, t, prev + t] = 1.0
                else:  # the previous position's previous token, into the token block (read by W_U)
                    a.W_V[0, prev + t, t] = 1.0
                    a.W_O[0, t, tok + t] = 5.0  # moderate: positions 0 and 1 have no token two back
    return model


def with_recent_head(model: AttnOnlyTransformer, window: int = 3) -> AttnOnlyTransformer:
    """``model`` (one of the block models above, standard positions) with L0H1 rewritten as a
    several-recent-tokens head: its queries and keys read only the position block, scoring 100 on
    the last ``window`` positions (the current one included) and 0 elsewhere, so it attends evenly
    to them; its OV is left as it was (small and random)."""
    V, P = model.cfg.d_vocab, model.cfg.n_ctx
    attn = model.blocks[0].attn
    if attn.W_Q.shape[-1] < P:
        raise ValueError(f"a recent head needs d_head >= n_ctx ({P}), got {attn.W_Q.shape[-1]}")
    sharp = 100.0 * model.cfg.d_head**0.5
    with torch.no_grad():
        attn.W_Q[1].zero_()
        attn.W_K[1].zero_()
        for p in range(P):
            attn.W_K[1, V + p, p] = 1.0
            for back in range(window):
                if p - back >= 0:
                    attn.W_Q[1, V + p, p - back] = sharp
    return model


def neuron_model(d_vocab: int = 9, n_ctx: int = 6) -> Transformer:
    """One layer, no LayerNorm, a ReLU MLP of 4 neurons, attention that writes nothing (every other
    weight zero): neuron 2's key reads coordinate 0, which token 5's embedding holds (2.0; token 1:
    0.5; token 4: -1.0) through ``W_in = 1.5``; its value writes coordinate 1, which the logit of
    token 7 reads with 3.0 and that of token 3 with -2.0. So token 5 excites it most (3.0), and
    its write raises token 7 most and lowers token 3 most, by 3.0 and 2.0 per unit of activation."""
    model = Transformer(Config(1, 1, 4, 2, d_vocab, n_ctx, d_mlp=4, act_fn="relu"))
    with torch.no_grad():
        for param in model.parameters():
            param.zero_()
        model.W_E[5, 0], model.W_E[1, 0], model.W_E[4, 0] = 2.0, 0.5, -1.0
        model.blocks[0].mlp.W_in[0, 2] = 1.5
        model.blocks[0].mlp.W_out[2, 1] = 1.0
        model.W_U[1, 7], model.W_U[1, 3] = 3.0, -2.0
    return model


def with_layer_norm(model: Transformer) -> Transformer:
    """The same algorithm behind LayerNorm (``normalization="LN"``, GPT-2's place for it): the
    residual stream is mirrored, ``x -> [x, -x]``, so every vector in it already has mean zero and
    LayerNorm only divides each position by its scale, a positive number per position, which
    sharpens every score and logit but changes no argmax. Readers read the first half, writers
    write both; LayerNorm's weight is drawn in ``[1, 1.1]`` and its bias is small, so folding them
    is not trivial."""
    cfg = model.cfg
    d = cfg.d_model
    ln_cfg = Config(**(cfg.to_dict() | {"d_model": 2 * d, "normalization": "LN"}))
    mirrored = Transformer(ln_cfg)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in mirrored.named_parameters():
            short = name.rsplit(".", 1)[-1]
            if short == "w":
                param.copy_(1.0 + 0.1 * torch.rand(param.shape, generator=gen))
            elif short == "b":
                param.copy_(0.001 * torch.randn(param.shape, generator=gen))
            else:
                param.zero_()
        for write in ("W_E", "W_pos"):
            W = getattr(model, write)
            getattr(mirrored, write).copy_(torch.cat([W, -W], dim=-1))
        mirrored.W_U[:d] = model.W_U
        for ours, theirs in zip(mirrored.blocks, model.blocks, strict=True):
            for read in ("W_Q", "W_K", "W_V"):
                getattr(ours.attn, read)[:, :d] = getattr(theirs.attn, read)
            ours.attn.W_O.copy_(torch.cat([theirs.attn.W_O, -theirs.attn.W_O], dim=-1))
    return mirrored
